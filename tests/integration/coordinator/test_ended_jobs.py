"""A job that ended on a standing coordinator still answers `ddpctl status|logs|stop --coordinator`
from its end record, as a local launch's does: how it ended, where its logs are, and its ranks'
lines; to its own user (and root) only. Before, the coordinator said the job was not running,
and the record it wrote was read by nobody."""
import json
import os
import subprocess
import sys
import time

import pytest

import protoclient

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "multinode"))
from loopsite import running_site  # noqa: E402
from simcluster import finish  # noqa: E402

SPEC = {"file": "j.yaml", "name": "j", "nnodes_min": 1, "nnodes_max": 2, "nproc": {"kind": "count", "count": 1},
        "command": ["/bin/true"], "shell": False, "env": [], "env_forward": [], "max_restarts": 0,
        "restart_backoff_ms": 1000, "log_dir": "/var/tmp", "log_max_bytes": 1 << 20, "store_port": 29500,
        "nccl_unique_id": "off", "stop_grace_ms": 1000, "forward_env": {}, "workdir": "/",
        "binding": {"gpu": "auto", "numa": "auto", "nic": "auto"}}

# Rank 1 fails, once rank 0 has said hello (or the agent would stop rank 0 first, at times
# before it printed).
WORKER = ("import os, pathlib, sys, time\n"
          "rank = os.environ['RANK']\n"
          "print(f'hello from rank {rank}', flush=True)\n"
          "mark = pathlib.Path(sys.argv[1]) / 'rank0.said'\n"
          "if rank == '0':\n"
          "    mark.touch()\n"
          "    sys.exit(0)\n"
          "deadline = time.monotonic() + 60\n"
          "while not mark.exists() and time.monotonic() < deadline:\n"
          "    time.sleep(0.01)\n"
          "sys.exit(3)\n")


@pytest.fixture
def site():
    with running_site() as s:
        yield s


def test_an_ended_job_answers_status_logs_and_stop(site):
    worker = site.dir / "worker.py"
    worker.write_text(WORKER)
    job = site.job("ends", ["/usr/bin/python3", str(worker), str(site.dir)], nproc=2)
    p = site.submit(job, "--job-id", "ends-1", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rc, _, err = finish(p, timeout=120)
    assert rc != 0 and "failed" in err, err + site.logs()

    r = site.ddpctl("status", "ends-1")
    assert r.returncode == 1, r.stdout + r.stderr  # not running
    # The exit code the submitter's ddpctl gave, and why.
    assert "job ends-1 ended" in r.stderr and f"(failed, exit code {rc}: rank 1 " in r.stderr, (rc, r.stderr)
    assert "logs on the coordinator's machine: " in r.stderr, r.stderr  # its paths are not ours
    assert "not running on this coordinator" not in r.stderr, r.stderr

    r = site.ddpctl("status", "--json", "ends-1")
    assert r.returncode == 1, r.stderr
    record = json.loads(r.stdout)
    assert record["state"] == "ended" and record["status"] == "failed" and record["exit_code"] == rc, record
    assert "files" not in record  # paths on the coordinator's machine are not handed out

    # Without an id, with nothing running: the last job that ended, said as such.
    r = site.ddpctl("status")
    assert r.returncode == 1 and "no job of yours is running; the last one: job ends-1 ended" in r.stderr, r.stderr

    # Its ranks' lines, read on the coordinator's machine and sent inline.
    r = site.ddpctl("logs", "ends-1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[0] hello from rank 0" in r.stdout and "[1] hello from rank 1" in r.stdout, r.stdout + r.stderr
    assert "job ends-1 ended" in r.stderr, r.stderr
    r = site.ddpctl("logs", "-f", "ends-1", timeout=60)  # nothing follows an ended job: it returns
    assert r.returncode == 0 and "[0] hello from rank 0" in r.stdout, r.stdout + r.stderr
    r = site.ddpctl("logs", "--ranks", "1", "ends-1")
    assert r.returncode == 0 and "[1] hello from rank 1" in r.stdout and "[0]" not in r.stdout, r.stdout + r.stderr
    # A rank file that became a link is skipped and named, as a local job's is.
    rank1 = [p for p in (site.dir / "coord-logs").rglob("*") if p.is_file() and "hello from rank 1" in p.read_text()]
    assert len(rank1) == 1, sorted(str(p) for p in (site.dir / "coord-logs").rglob("*"))
    rank1[0].rename(rank1[0].with_name("moved"))
    rank1[0].symlink_to(rank1[0].with_name("moved"))
    r = site.ddpctl("logs", "ends-1")
    assert r.returncode == 0 and "[0] hello from rank 0" in r.stdout and "[1]" not in r.stdout, r.stdout + r.stderr
    assert f"ddpctl logs: rank 1: cannot read {rank1[0]}" in r.stderr, r.stderr
    r = site.ddpctl("logs", "--ranks", "7", "ends-1")
    assert r.returncode != 0 and "no rank 7" in r.stderr, r.stdout + r.stderr

    r = site.ddpctl("stop", "ends-1")
    assert r.returncode == 1 and "nothing to stop" in r.stderr and "ended" in r.stderr, r.stderr

    # An id that never ran here is still refused, saying so.
    r = site.ddpctl("status", "other")
    assert r.returncode == 1 and "not running on this coordinator" in r.stderr, r.stderr


def test_an_older_ddpctl_is_told_the_job_is_not_running(site):
    """A ddpctl from before these answers knows no "ended": the first line says "ok": false with
    the reason, so it prints that and exits 1 as it did, rather than reading a status of nothing."""
    job = site.job("quick", ["/bin/true"])
    p = site.submit(job, "--job-id", "quick-1", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rc, _, err = finish(p, timeout=120)
    assert rc == 0, err + site.logs()
    key_id, secret = protoclient.read_token(site.token)
    for op in ("status", "stop", "logs", "stacks"):
        c = protoclient.Client("127.0.0.1", site.coord_port, key_id, secret, role="ctl", user="root", timeout=60)
        c.send("control", job_id="quick-1", line=json.dumps({"op": op}) + "\n")
        m = c.receive()
        c.close()
        assert m["type"] == "control", m
        first = json.loads(m["line"])
        assert first["ok"] is False and "quick-1 is not running: it ended" in first["error"], first
        assert first["ended"]["status"] == "succeeded" and first["ended"]["exit_code"] == 0, first


def test_a_job_id_used_again_answers_for_the_new_run_only(site):
    """The second run of an id fails before it has a control socket (its nodes are listed twice):
    the first run's record must not answer for it, nor show the first run's lines."""
    worker = site.dir / "worker.py"
    worker.write_text(WORKER)
    job = site.job("again", ["/usr/bin/python3", str(worker), str(site.dir)], nproc=2)
    p = site.submit(job, "--job-id", "again-1", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    finish(p, timeout=120)
    r = site.ddpctl("logs", "again-1")
    assert "hello from rank 0" in r.stdout, r.stdout + r.stderr

    # ddpctl refuses such --nodes itself; a client of its own sends them (no --key-user here: the
    # coordinator takes a submission without a delegation, as from a version-5 ddpctl).
    key_id, secret = protoclient.read_token(site.token)
    c = protoclient.Client("127.0.0.1", site.coord_port, key_id, secret, role="ctl", user="root", version=5,
                           timeout=60)
    node = f"127.0.0.1:{site.agent_port}"
    c.send("submit", job_id="again-1", user="root", spec=dict(SPEC, log_dir=str(site.dir)), nodes=[node, node])
    answers = []
    while not answers or answers[-1]["type"] not in ("job_result", "error"):
        answers.append(c.receive())
    c.close()
    assert answers[-1]["type"] == "job_result" and answers[-1]["state"] == "failed", answers
    assert "listed twice" in answers[-1]["message"], answers

    r = site.ddpctl("logs", "again-1")
    assert "hello from rank" not in r.stdout, r.stdout + r.stderr
    assert "job again-1 ended 0 s ago (failed, exit code 2)" in r.stderr, r.stderr


def test_a_user_is_remembered_for_their_last_64_jobs(site):
    job = site.job("many", ["/bin/true"])
    for i in range(66):
        p = site.submit(job, "--job-id", f"many-{i}", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        rc, _, err = finish(p, timeout=120)
        assert rc == 0, err + site.logs()
    for i in (0, 1):
        r = site.ddpctl("status", f"many-{i}")
        assert r.returncode == 1 and "nor is it among the jobs of yours that it remembers" in r.stderr, r.stderr
    for i in (2, 65):
        r = site.ddpctl("status", f"many-{i}")
        assert r.returncode == 1 and f"job many-{i} ended" in r.stderr and "succeeded" in r.stderr, r.stderr
    r = site.ddpctl("status")
    assert "the last one: job many-65 ended" in r.stderr, r.stderr


# Attempt 0: both ranks print, then fail together (each waits for the other's line first, so no
# rank is stopped before it printed); attempt 1 prints and waits for the test's go.
ATTEMPTS = ("import os, pathlib, sys, time\n"
            "n, rank = os.environ['TORCHELASTIC_RESTART_COUNT'], os.environ['RANK']\n"
            "print(f'attempt {n} rank {rank}', flush=True)\n"
            "d = pathlib.Path(sys.argv[1])\n"
            "(d / f'said-{n}-{rank}').touch()\n"
            "deadline = time.monotonic() + 60\n"
            "def wait(p):\n"
            "    while not p.exists() and time.monotonic() < deadline:\n"
            "        time.sleep(0.02)\n"
            "if n == '0':\n"
            "    wait(d / f'said-0-{1 - int(rank)}')\n"
            "    sys.exit(3)\n"
            "wait(d / 'go')\n")


def test_earlier_attempts_lines_through_the_coordinator(site):
    """`ddpctl logs --attempt N|all --coordinator`: the attempts' files are on the coordinator's
    machine; it finds them beside the job's current (or last) ones and sends their lines, each
    attempt after a line naming it, for a running job and for one that ended."""
    worker = site.dir / "attempts.py"
    worker.write_text(ATTEMPTS)
    job = site.job("att", ["/usr/bin/python3", str(worker), str(site.dir)], nproc=2,
                   extra="restart: {max_restarts: 1, backoff: 0.1s}\n")
    p = site.submit(job, "--job-id", "att-1", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while not all((site.dir / f"said-1-{r}").exists() for r in (0, 1)):
            assert time.time() < deadline and p.poll() is None, site.logs()
            time.sleep(0.05)
        # Running, in attempt 1.
        r = site.ddpctl("logs", "--attempt", "0", "att-1")
        assert r.returncode == 0, r.stdout + r.stderr
        assert sorted(r.stdout.splitlines()) == ["[0] attempt 0 rank 0", "[1] attempt 0 rank 1"], r.stdout + r.stderr
        assert "ddpctl logs: job att-1, attempt 0\n" in r.stderr, r.stderr
        deadline = time.time() + 30
        while True:  # attempt 1's lines reach the coordinator's copy as they come
            r = site.ddpctl("logs", "--attempt", "all", "--ranks", "1", "att-1")
            if r.stdout.splitlines() == ["[1] attempt 0 rank 1", "[1] attempt 1 rank 1"] or time.time() > deadline:
                break
            time.sleep(0.1)
        assert r.returncode == 0 and r.stdout.splitlines() == ["[1] attempt 0 rank 1", "[1] attempt 1 rank 1"], \
            r.stdout + r.stderr
        assert "job att-1, attempt 1 (the latest)" in r.stderr, r.stderr
        r = site.ddpctl("logs", "--attempt", "2", "att-1")
        assert r.returncode == 1 and "job att-1 has no attempt 2 (it has attempts 0-1)" in r.stderr, r.stderr
    finally:
        (site.dir / "go").touch()
    rc, _, err = finish(p, timeout=120)
    assert rc == 0, err + site.logs()
    # Ended: from its end record.
    r = site.ddpctl("logs", "--attempt", "all", "att-1")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert sorted(lines[:2]) == ["[0] attempt 0 rank 0", "[1] attempt 0 rank 1"], lines
    assert sorted(lines[2:]) == ["[0] attempt 1 rank 0", "[1] attempt 1 rank 1"], lines
    assert "job att-1, attempt 0\n" in r.stderr and "job att-1, attempt 1 (the last)" in r.stderr, r.stderr
    r = site.ddpctl("logs", "--attempt", "0", "--ranks", "1", "att-1")
    assert r.returncode == 0 and r.stdout.splitlines() == ["[1] attempt 0 rank 1"], r.stdout + r.stderr
    r = site.ddpctl("logs", "--attempt", "0", "--ranks", "4", "att-1")
    assert r.returncode == 1 and "attempt 0: no log file of rank 4 (there are ranks 0,1)" in r.stderr, r.stderr
    r = site.ddpctl("logs", "--attempt", "x", "att-1")
    assert r.returncode == 2 and "--attempt: expected an attempt number" in r.stderr, r.stderr
