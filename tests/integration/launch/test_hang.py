"""The hang watchdog (job file `hang:`) on a local launch, with real gloo ranks on CPU: rank 1
stuck in Python while the others wait in all_reduce is a hang (stop, report, restart), and a
rank computing silently for three times the timeout, in Python and in C, is not. Timeouts are
a few seconds (at least 3 s: ranks importing torch at once on a loaded machine can stand still in
dlopen for a couple of seconds); no assertion is about speed."""
import json
import os
import subprocess
from pathlib import Path

from ddptest import DDPCTL, PYTHON, SOURCE_DIR, launch, wait_for, write_job

WORKER = SOURCE_DIR / "tests" / "integration" / "launch" / "hang_worker.py"


def hang_job(tmp: Path, hang: str, args: str, nproc=4, extra=""):
    return write_job(tmp, f"name: hang\nnproc_per_node: {nproc}\ncommand: [{PYTHON}, {WORKER}, {args}]\n"
                          f"stop: {{grace: 2s}}\nnccl: {{unique_id: off}}\nhang: {hang}\n{extra}")


def test_stuck_rank_stops_the_job_with_its_stacks(tmp_path):
    job = hang_job(tmp_path, "{timeout: 3s, action: stop}", "hang")
    r = launch(job, "--job-id", "hang-stop", "--result-json", str(tmp_path / "result.json"), timeout=120)
    assert r.returncode == 124, r.stderr
    assert "hung: no rank made progress for 3s" in r.stderr
    # rank 1's function, named with its rank, and the others' all_reduce
    assert "stuck_forever" in r.stderr and "all_reduce" in r.stderr, r.stderr
    stacks = (tmp_path / "logs" / "hang-stop" / "attempt-0" / "hang-stacks.txt").read_text()
    assert "hung: no rank made progress for 3s" in stacks
    lines = stacks.splitlines()
    stuck = next(i for i, line in enumerate(lines) if "stuck_forever" in line)
    assert lines[stuck - 1].startswith("rank 1 (1 of 4)"), stacks  # the odd rank, first
    res = json.loads((tmp_path / "result.json").read_text())
    assert res["status"] == "failed" and res["exit_code"] == 124
    assert res["message"] == "hung: no rank made progress for 3s"


def test_silent_computation_in_python_and_in_c_is_not_a_hang(tmp_path):
    # Rank 0 is silent for 9 s in Python, then 9 s in C calls on one line, three times the
    # timeout each; the others wait in all_reduce all along.
    job = hang_job(tmp_path, "{timeout: 3s, action: stop}", "silent, '9'")
    r = launch(job, "--job-id", "hang-silent", timeout=180)
    assert r.returncode == 0, r.stderr
    assert "computed silently: python" in r.stdout
    assert "hung" not in r.stderr, r.stderr
    assert not (tmp_path / "logs" / "hang-silent" / "attempt-0" / "hang-stacks.txt").exists()


def test_report_keeps_the_job_running_and_says_it_once(tmp_path):
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    rt = tmp_path / "rt"
    rt.mkdir(mode=0o700)
    job = hang_job(tmp_path, "{timeout: 4s, action: report}", f"fifo, {fifo}")
    env = dict(os.environ, XDG_RUNTIME_DIR=str(rt))
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err, open(tmp_path / "stdout.txt", "w") as out:
        p = subprocess.Popen([DDPCTL, "launch", str(job), "--master-port", "0", "--job-id", "hang-report"],
                             cwd=tmp_path, env=env, stdout=out, stderr=err)
    try:
        wait_for(lambda: "hung: no rank made progress for 4s" in err_path.read_text(), timeout=60, what="the hang report")

        def status():
            r = subprocess.run([DDPCTL, "status", "--json", "hang-report"], env=env, capture_output=True, text=True, timeout=30)
            return json.loads(r.stdout)["hang"] if r.returncode == 0 else {}
        # The same hang goes on for three timeouts more: still one report.
        wait_for(lambda: status().get("idle_s", 0) >= 12, timeout=60, what="12 s without progress")
        assert status()["hung"] is True
        assert p.poll() is None
        with open(fifo, "wb") as f:  # releases rank 1: the job ends well
            f.write(b"x")
        assert p.wait(timeout=60) == 0, err_path.read_text()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    err = err_path.read_text()
    assert err.count("hung: no rank made progress") == 1, err
    assert "stuck_until_fifo" in err
    assert (tmp_path / "stdout.txt").read_text().count("done: 4") == 4


def test_restart_restarts_the_attempt(tmp_path):
    job = hang_job(tmp_path, "{timeout: 4s, action: restart}", "once", extra="restart: {max_restarts: 1, backoff: 0s}\n")
    r = launch(job, "--job-id", "hang-restart", "--result-json", str(tmp_path / "result.json"), timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("hung: no rank made progress for 4s (hang.action: restart)") == 1, r.stderr
    res = json.loads((tmp_path / "result.json").read_text())
    assert res["status"] == "succeeded" and res["restarts"] == 1
    assert (tmp_path / "logs" / "hang-restart" / "attempt-0" / "hang-stacks.txt").exists()


def test_restart_without_restarts_left_fails_naming_the_hang(tmp_path):
    job = hang_job(tmp_path, "{timeout: 4s, action: restart}", "hang", nproc=2)
    r = launch(job, "--job-id", "hang-norestart", timeout=120)
    assert r.returncode == 1, r.stderr
    assert "hung: no rank made progress for 4s" in r.stderr
