"""The local launch end to end: real processes, real signals, real PyTorch (gloo on CPU)."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from ddptest import DDPCTL, PYTHON, SOURCE_DIR, alive, launch, read_pids, start_launch, wait_for, write_job

TRAIN = SOURCE_DIR / "examples" / "python" / "train_ddp.py"


def py_job(tmp: Path, script: str, nproc=2, extra=""):
    s = tmp / "worker.py"
    s.write_text(script)
    return write_job(tmp, f"nproc_per_node: {nproc}\ncommand: [{PYTHON}, {s}]\nstop: {{grace: 1s}}\n{extra}")


def test_contract_seen_from_inside_workers(tmp_path):
    job = py_job(tmp_path, """
import json, os
r = os.environ["RANK"]
json.dump(dict(os.environ), open(f"env-{r}.json", "w"))
""", nproc=3)
    polluted = {"SLURM_PROCID": "7", "SLURM_JOB_ID": "1", "RANK": "99", "LOCAL_RANK": "5", "PET_NNODES": "4",
                "NCCL_COMM_ID": "10.0.0.1:1234", "OMPI_COMM_WORLD_RANK": "3", "MY_OWN_VAR": "kept"}
    r = launch(job, "--job-id", "contract-1", env=polluted)
    assert r.returncode == 0, r.stderr
    envs = [json.loads((tmp_path / f"env-{i}.json").read_text()) for i in range(3)]
    port = envs[0]["MASTER_PORT"]
    assert int(port) > 0
    for i, e in enumerate(envs):
        assert e["RANK"] == str(i) and e["LOCAL_RANK"] == str(i)
        assert e["WORLD_SIZE"] == "3" and e["LOCAL_WORLD_SIZE"] == "3"
        assert e["GROUP_RANK"] == "0" and e["GROUP_WORLD_SIZE"] == "1"
        assert e["ROLE_NAME"] == "default" and e["ROLE_RANK"] == str(i) and e["ROLE_WORLD_SIZE"] == "3"
        assert e["MASTER_ADDR"] == "127.0.0.1" and e["MASTER_PORT"] == port
        assert e["TORCHELASTIC_RESTART_COUNT"] == "0" and e["TORCHELASTIC_MAX_RESTARTS"] == "0"
        assert e["TORCHELASTIC_RUN_ID"] == "contract-1" and e["DDP_JOB_ID"] == "contract-1"
        assert e["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        assert e["TORCHELASTIC_ERROR_FILE"].endswith(f"contract-1/attempt-0/rank-{i}.error.json")
        assert e["OMP_NUM_THREADS"] == "1"
        # Debian's torch 1.13 reads only the old name (test_python_env.py has the rest)
        assert e["NCCL_ASYNC_ERROR_HANDLING"] == "1" and "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in e
        assert e["NCCL_SOCKET_IFNAME"] == "lo" and e["GLOO_SOCKET_IFNAME"] == "lo"
        for gone in ("SLURM_PROCID", "SLURM_JOB_ID", "PET_NNODES", "NCCL_COMM_ID", "OMPI_COMM_WORLD_RANK"):
            assert gone not in e, gone
        assert e["MY_OWN_VAR"] == "kept"
    # the log files hold each rank's output, under <dir>/<job-id>/attempt-<n>/
    assert (tmp_path / "logs" / "contract-1" / "attempt-0" / "rank-2.log").exists()


def test_a_stopped_python_ranks_last_words_are_in_its_log(tmp_path):
    """A rank writes into a pipe, where Python holds its output in blocks: without
    PYTHONUNBUFFERED the line rank 0 printed before rank 1 failed stayed in its buffer and died
    with it, so neither the report nor the log showed it."""
    job = py_job(tmp_path, """
import os, sys, time
if os.environ["RANK"] == "0":
    print("rank 0 loaded its data")
    open("printed", "w").close()
    time.sleep(600)
while not os.path.exists("printed"):
    time.sleep(0.02)
sys.exit(4)
""")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    r = subprocess.run([DDPCTL, "launch", str(job), "--master-port", "0", "--job-id", "unbuffered-1"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "exited with code 4" in r.stderr, r.stderr
    log = (tmp_path / "logs" / "unbuffered-1" / "attempt-0" / "rank-0.log").read_text()
    assert "rank 0 loaded its data" in log, log
    assert "rank 0 loaded its data" in r.stdout + r.stderr
    # The job's own choice stands.
    job = py_job(tmp_path, "import os; open('seen', 'w').write(os.environ.get('PYTHONUNBUFFERED', '-'))", nproc=1,
                 extra="env: {PYTHONUNBUFFERED: ''}\n")
    r = subprocess.run([DDPCTL, "launch", str(job), "--master-port", "0"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "seen").read_text() == ""


def test_failing_rank_stops_everyone_and_nothing_survives(tmp_path):
    # Rank 1 fails. The others each start a grandchild that ignores SIGTERM and calls setsid(),
    # and themselves ignore SIGTERM: only the grace period's SIGKILL, through the cgroup or the
    # subreaper walk, can end them.
    job = py_job(tmp_path, """
import glob, os, signal, sys, time
def publish(name, pid):  # atomically: rank 1 and the test never read a half-written file
    open(name + ".tmp", "w").write(str(pid))
    os.rename(name + ".tmp", name)
r = int(os.environ["RANK"])
if r == 1:
    # fails only once the others are set up (two workers, two grandchildren), within 30 s
    deadline = time.monotonic() + 30
    while len(glob.glob("*.pid")) < 4 and time.monotonic() < deadline: time.sleep(0.02)
    print("rank 1 gives up", flush=True)
    sys.exit(3)
if os.fork() == 0:
    os.setsid()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.fork() == 0:
        publish(f"grandchild-{r}.pid", os.getpid())
        while True: time.sleep(1)
    os._exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
publish(f"worker-{r}.pid", os.getpid())
while True: time.sleep(1)
""", nproc=3)
    result = tmp_path / "result.json"
    r = launch(job, "--result-json", str(result), timeout=60)
    assert r.returncode == 1, r.stderr
    assert "first failure: rank 1" in r.stderr and "exited with code 3" in r.stderr
    assert "rank 1 gives up" in r.stderr  # its last lines are in the report
    pids = read_pids(tmp_path)
    assert len(pids) == 4, pids  # two workers, two grandchildren
    for pid in pids:
        assert not alive(pid), f"pid {pid} outlived the job"
    res = json.loads(result.read_text())
    assert res["status"] == "failed" and res["exit_code"] == 1
    ff = res["attempts"][0]["first_failure"]
    assert ff["rank"] == 1 and ff["exit_code"] == 3 and ff["signal"] is None
    assert "rank 1 gives up" in ff["last_lines"]


def test_a_daemon_left_by_a_successful_job_is_stopped(tmp_path):
    # Every rank succeeds, one after starting a daemon (double fork, setsid(), SIGTERM ignored)
    # that would run on: the launch ends only once it is gone, and says so.
    job = py_job(tmp_path, """
import os, signal, sys, time
if int(os.environ["RANK"]) == 0:
    if os.fork() == 0:
        os.setsid()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if os.fork() == 0:
            open("daemon.pid.tmp", "w").write(str(os.getpid()))
            os.rename("daemon.pid.tmp", "daemon.pid")
            while True: time.sleep(1)
        os._exit(0)
    deadline = time.monotonic() + 30
    while not os.path.exists("daemon.pid") and time.monotonic() < deadline: time.sleep(0.02)
""", nproc=2)
    try:
        r = launch(job, timeout=60)
        pids = read_pids(tmp_path)
        assert r.returncode == 0, r.stderr
        assert len(pids) == 1, pids
        assert "stopping processes the workers left behind" in r.stderr, r.stderr
        assert not alive(pids[0]), f"the daemon (pid {pids[0]}) outlived the job"
    finally:
        for pid in read_pids(tmp_path):  # the test's own daemon, also when the launch timed out
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_restart_counts_and_succeeds(tmp_path):
    job = py_job(tmp_path, """
import os, sys
n = os.environ["TORCHELASTIC_RESTART_COUNT"]
open(f"seen-{os.environ['RANK']}-{n}", "w").write(os.environ["DDP_ATTEMPT"])
sys.exit(1 if n == "0" and os.environ["RANK"] == "0" else 0)
""", extra="restart: {max_restarts: 3, backoff: 100ms}\n")
    result = tmp_path / "r.json"
    r = launch(job, "--result-json", str(result))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "seen-0-0").exists() and (tmp_path / "seen-0-1").exists()
    assert not (tmp_path / "seen-0-2").exists()
    res = json.loads(result.read_text())
    assert res["status"] == "succeeded" and res["restarts"] == 1
    assert [a["result"] for a in res["attempts"]] == ["failed", "succeeded"]


def test_restarts_run_out(tmp_path):
    job = py_job(tmp_path, "import sys; sys.exit(2)\n", nproc=1, extra="restart: {max_restarts: 2, backoff: 50ms}\n")
    result = tmp_path / "r.json"
    r = launch(job, "--result-json", str(result))
    assert r.returncode == 1
    assert len(json.loads(result.read_text())["attempts"]) == 3
    assert "failed after 2 restarts" in r.stderr


# The four torchrun stops on (its TORCHELASTIC_SIGNALS_TO_HANDLE); SIGQUIT's default would dump
# ddpctl's core and leave the workers to their death signal.
@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129),
                                      (signal.SIGQUIT, 131)])
def test_stop_signal_stops_job_without_spending_a_restart(tmp_path, sig, code):
    job = py_job(tmp_path, """
import os, time
open(f"worker-{os.environ['RANK']}.pid", "w").write(str(os.getpid()))
while True: time.sleep(1)
""", extra="restart: {max_restarts: 3}\n")
    result = tmp_path / "r.json"
    p = start_launch(job, "--result-json", str(result))
    wait_for(lambda: len(list(tmp_path.glob("*.pid"))) == 2, what="workers to start")
    p.send_signal(sig)
    out, err = p.communicate(timeout=30)
    assert p.returncode == code, err
    for pid in read_pids(tmp_path):
        assert not alive(pid)
    res = json.loads(result.read_text())
    assert res["status"] == "stopped" and len(res["attempts"]) == 1 and res["restarts"] == 0


def test_a_stop_is_one_sigterm_per_worker(tmp_path):
    # A script that treats a second SIGTERM as "abort now" must not get one from a single stop:
    # the worker (and a child in its process group) each count what reaches them.
    job = py_job(tmp_path, """
import os, signal, subprocess, sys, time
r = os.environ["RANK"]
child = subprocess.Popen([sys.executable, "-c", '''
import os, signal, sys, time
r = sys.argv[1]
signal.signal(signal.SIGTERM, lambda *_: open(f"child-{r}.terms", "a").write("T"))
open(f"child-{r}.ready", "w").write("")
time.sleep(5); sys.exit(0)
''', r])
signal.signal(signal.SIGTERM, lambda *_: open(f"worker-{r}.terms", "a").write("T"))
open(f"worker-{r}.ready", "w").write("")
time.sleep(5)
child.wait()
sys.exit(0)
""")
    p = start_launch(job)
    wait_for(lambda: len(list(tmp_path.glob("*.ready"))) == 4, what="workers and their children to start")
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=30)
    for name in ("worker-0", "worker-1", "child-0", "child-1"):
        assert (tmp_path / f"{name}.terms").read_text() == "T", name  # one T per SIGTERM received


def test_sigusr1_is_passed_to_workers(tmp_path):
    job = py_job(tmp_path, """
import os, signal, time
r = os.environ["RANK"]
signal.signal(signal.SIGUSR1, lambda *_: open(f"usr1-{r}", "w").write("got it"))
open(f"ready-{r}", "w").write("")
deadline = time.time() + 20
while not os.path.exists(f"usr1-{r}") and time.time() < deadline: time.sleep(0.05)
""")
    p = start_launch(job)
    wait_for(lambda: len(list(tmp_path.glob("ready-*"))) == 2, what="workers to be ready")
    p.send_signal(signal.SIGUSR1)
    p.communicate(timeout=30)
    assert p.returncode == 0
    assert (tmp_path / "usr1-0").read_text() == "got it" and (tmp_path / "usr1-1").exists()


def test_error_file_is_in_the_report(tmp_path):
    job = py_job(tmp_path, """
import os
from torch.distributed.elastic.multiprocessing.errors import record
@record
def main():
    if os.environ["RANK"] == "1":
        raise ValueError("the learning rate is nan")
main()
""")
    result = tmp_path / "r.json"
    r = launch(job, "--result-json", str(result))
    assert r.returncode == 1
    assert "ValueError: the learning rate is nan" in r.stderr
    ff = json.loads(result.read_text())["attempts"][0]["first_failure"]
    assert ff["rank"] == 1 and "the learning rate is nan" in ff["error_file"]["message"]
    assert "Traceback" in ff["error_file"]["traceback"] or "line" in ff["error_file"]["traceback"]


def test_port_taken_is_reported_before_any_worker(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    port = s.getsockname()[1]
    job = py_job(tmp_path, "open('started', 'w').write('')\n")
    r = subprocess.run([DDPCTL, "launch", str(job), "--master-port", str(port)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=30)
    s.close()
    assert r.returncode == 2
    assert str(port) in r.stderr and "store.port" in r.stderr
    assert not (tmp_path / "started").exists()


def test_flags_that_cannot_work_are_refused_before_any_worker(tmp_path):
    # `--nodes "$NODES"` with NODES unset must not quietly run here; a result file that cannot be
    # written must be found out before the job, not after it.
    job = py_job(tmp_path, "open('started', 'w').write('')\n")
    r = launch(job, "--nodes", "")
    assert r.returncode == 2 and "--nodes: is empty" in r.stderr, r.stderr
    r = launch(job, "--result-json", str(tmp_path / "no-such-dir" / "r.json"))
    assert r.returncode == 2 and "does not exist" in r.stderr, r.stderr
    assert not (tmp_path / "started").exists()


def test_bad_job_file_names_line_and_column(tmp_path):
    job = write_job(tmp_path, "command: [x]\nnproc_per_nod: 4\n")
    r = launch(job)
    assert r.returncode == 2
    assert f"{job}:2:1: error: unknown key 'nproc_per_nod' (did you mean 'nproc_per_node'?)" in r.stderr


def test_missing_program_is_clear(tmp_path):
    job = write_job(tmp_path, "command: [no-such-trainer-xyz]\n")
    r = launch(job)
    assert r.returncode == 2
    assert "'no-such-trainer-xyz' is not found on PATH (" in r.stderr
    assert "PATH=" not in r.stderr  # named by its first folders, not dumped whole
    # Refused before any attempt: --result-json still says why.
    r = launch(job, "--result-json", str(tmp_path / "result.json"), "--job-id", "refused-1")
    assert r.returncode == 2, r.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["status"] == "failed" and result["exit_code"] == 2 and result["job_id"] == "refused-1", result
    assert "'no-such-trainer-xyz' is not found on PATH" in result["message"] and result["attempts"] == [], result
    # A dry run refuses what the launch refuses: it is how a job file is checked.
    r = launch(job, "--dry-run")
    assert r.returncode == 2 and "'no-such-trainer-xyz' is not found on PATH (" in r.stderr, r.stderr
    assert r.stdout == ""


def test_dry_run_plans_and_starts_nothing(tmp_path):
    job = py_job(tmp_path, "open('started', 'w').write('')\n", nproc=4)
    r = subprocess.run([DDPCTL, "launch", "--dry-run", str(job), "--job-id", "dry"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert [x["rank"] for x in plan["ranks"]] == [0, 1, 2, 3]
    assert plan["ranks"][3]["env"]["LOCAL_RANK"] == "3"
    assert plan["ranks"][0]["argv"][0] == PYTHON
    assert "binding" in plan["ranks"][0]
    assert not (tmp_path / "started").exists() and not (tmp_path / "logs").exists()


DRY_RUN_SCHEMA = json.loads((SOURCE_DIR / "proto" / "dry-run.schema.json").read_text())


def test_dry_run_shows_what_ddpctl_sets_and_the_job_names_not_the_launchers_secrets(tmp_path):
    """Dry runs get pasted into bug reports: a variable that only passes through from ddpctl's own
    environment (a cloud key) is left out, counted and said to be, unless --show-env; what ddpctl
    sets and what the job names (env:, env_forward:) are shown. The JSON has the --nodes shape."""
    job = write_job(tmp_path, f"nproc_per_node: 2\ncommand: [{PYTHON}, train.py]\nenv: {{MY_SETTING: 'on'}}\n"
                              "env_forward: [WANDB_*]\n")
    env = dict(os.environ, AWS_SECRET_ACCESS_KEY="hunter2-not-for-bug-reports", WANDB_PROJECT="demo")
    dry = [DDPCTL, "launch", "--dry-run", str(job), "--job-id", "dry-env"]
    r = subprocess.run(dry, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "hunter2" not in r.stdout and "AWS_SECRET_ACCESS_KEY" not in r.stdout
    plan = json.loads(r.stdout)
    jsonschema.Draft202012Validator.check_schema(DRY_RUN_SCHEMA)
    jsonschema.Draft202012Validator(DRY_RUN_SCHEMA).validate(plan)
    assert plan["nnodes"] == 1 and plan["master_addr"] == "127.0.0.1" and len(plan["nodes"]) == 1
    for rank in plan["ranks"]:
        e = rank["env"]
        assert e["RANK"] == str(rank["rank"]) and e["MASTER_ADDR"] == "127.0.0.1" and e["OMP_NUM_THREADS"] == "1"
        assert e["MY_SETTING"] == "on" and e["WANDB_PROJECT"] == "demo"
        assert "PATH" not in e and "HOME" not in e
    assert plan["env"]["all"] is False and plan["env"]["left_out"] >= 3  # PATH, HOME and the key at least
    assert f"{plan['env']['left_out']} more" in plan["notes"][0] and "--show-env" in plan["notes"][0]

    r = subprocess.run(dry + ["--show-env"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    jsonschema.Draft202012Validator(DRY_RUN_SCHEMA).validate(plan)
    assert plan["env"] == {"all": True, "left_out": 0}
    assert plan["ranks"][0]["env"]["AWS_SECRET_ACCESS_KEY"] == "hunter2-not-for-bug-reports"
    assert plan["ranks"][0]["env"]["PATH"] == env["PATH"]

    r = subprocess.run([DDPCTL, "launch", "--show-env", str(job)], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "--show-env is for --dry-run" in r.stderr, r.stderr


def test_ranks_filter_and_log_files(tmp_path):
    job = py_job(tmp_path, "import os; print('hello from', os.environ['RANK'])\n", nproc=3)
    r = launch(job, "--ranks", "2", "--job-id", "filt")
    assert r.returncode == 0
    assert "[2] hello from 2" in r.stdout and "[0]" not in r.stdout and "[1]" not in r.stdout
    r = launch(job, "--ranks", "2,7", "--job-id", "filt-7")  # a typo: said, and the job runs all the same
    assert r.returncode == 0 and "[2] hello from 2" in r.stdout
    assert "--ranks: the job has no rank 7 (it has ranks 0-2)" in r.stderr, r.stderr
    r = launch(job, "--ranks", "1-2", "--job-id", "filt-range")  # a range, as `ddpctl logs --ranks` takes
    assert r.returncode == 0 and "[0]" not in r.stdout, r.stdout
    assert "[1] hello from 1" in r.stdout and "[2] hello from 2" in r.stdout, r.stdout
    log = (tmp_path / "logs" / "filt" / "attempt-0" / "rank-0.log").read_text()
    assert "out| hello from 0" in log and "exited with code 0" in log


def test_pytorch_ddp_ranks_end_with_identical_parameters(tmp_path):
    job = write_job(tmp_path, f"""nproc_per_node: 3
command: [{PYTHON}, {TRAIN}, --epochs, "3", --dump-params, "{tmp_path}/params-{{rank}}.json"]
""")
    r = launch(job, timeout=300)
    assert r.returncode == 0, r.stderr
    params = [json.loads((tmp_path / f"params-{i}.json").read_text())["params"] for i in range(3)]
    assert len(params[0]) > 100
    assert params[0] == params[1] == params[2]
    losses = [float(line.split()[-1]) for line in r.stdout.splitlines() if "loss" in line]
    assert len(losses) == 3 and losses[-1] < losses[0]  # it learns


def test_restart_from_checkpoint_matches_uninterrupted_run(tmp_path):
    def run(name, crash):
        d = tmp_path / name
        d.mkdir()
        args = f'--epochs, "4", --dump-params, "{d}/params-{{rank}}.json"' + (', --crash, "1:2"' if crash else "")
        job = write_job(d, f"nproc_per_node: 2\ncommand: [{PYTHON}, {TRAIN}, {args}]\n"
                           "restart: {max_restarts: 1, backoff: 100ms}\nstop: {grace: 5s}\n"
                           "store: {threads: 0}\n")  # the store on the launcher's loop, reset between attempts
        r = launch(job, "--result-json", str(d / "r.json"), timeout=300)
        assert r.returncode == 0, r.stderr
        return r, json.loads((d / "params-0.json").read_text())["params"], json.loads((d / "r.json").read_text())

    _, clean, clean_res = run("clean", crash=False)
    r, resumed, res = run("crashed", crash=True)
    assert len(clean_res["attempts"]) == 1
    assert len(res["attempts"]) == 2 and res["attempts"][0]["first_failure"]["rank"] == 1
    assert "resumed from" in r.stdout
    assert len(clean) == len(resumed)
    for a, b in zip(clean, resumed):
        assert abs(a - b) <= 1e-6 * max(1.0, abs(a)), (a, b)


def test_nproc_gpu_from_a_facts_file(tmp_path):
    job = write_job(tmp_path, "nproc_per_node: gpu\ncommand: [python3, train.py]\n")
    facts = SOURCE_DIR / "tests" / "fixtures" / "facts" / "dgx-a.json"
    r = subprocess.run([DDPCTL, "launch", "--dry-run", str(job), "--facts", str(facts)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert len(plan["ranks"]) == 8 and {x["node"] for x in plan["ranks"]} == {"dgx-a"}
    assert plan["ranks"][7]["env"]["LOCAL_WORLD_SIZE"] == "8"
    # The same from the command line, as torchrun's --nproc-per-node gpu; over a job file's count too.
    for args in (["-n", "gpu", "--", "python3", "train.py"],
                 [str(write_job(tmp_path, "nproc_per_node: 2\ncommand: [python3, train.py]\n")), "-n", "gpu"]):
        r = subprocess.run([DDPCTL, "launch", "--dry-run", "--facts", str(facts), *args], cwd=tmp_path,
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        assert len(json.loads(r.stdout)["ranks"]) == 8
    r = subprocess.run([DDPCTL, "launch", "--dry-run", "-n", "many", "--", "python3", "train.py"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "expected a count from 1 to 4096, cpu or gpu, got 'many'" in r.stderr, r.stderr


def test_nproc_gpu_without_gpus_is_a_clear_error(tmp_path):
    job = write_job(tmp_path, "nproc_per_node: gpu\ncommand: [python3, train.py]\n")
    facts = SOURCE_DIR / "tests" / "fixtures" / "facts" / "cpu-a.json"
    r = subprocess.run([DDPCTL, "launch", str(job), "--facts", str(facts)], cwd=tmp_path, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2
    assert "nproc_per_node: gpu, but" in r.stderr and "has no GPU" in r.stderr


@pytest.mark.parametrize("cgroup", [True, False], ids=["cgroup", "no-cgroup"])
def test_a_sigkilled_launchers_workers_and_what_they_started_die_with_it(tmp_path, cgroup):
    # ddpctl is SIGKILLed: its workers die by PDEATHSIG, which the kernel does not pass on to
    # their children. The attempt's guardian kills the rest: the whole cgroup (a grandchild that
    # called setsid() too), or without one each rank's process group (a `sh -c` command's
    # program, a data loader).
    job = py_job(tmp_path, """
import os, time
def publish(name, pid):  # atomically: the test must never read a half-written file
    open(name + ".tmp", "w").write(str(pid))
    os.rename(name + ".tmp", name)
if os.fork() == 0:
    publish("child.pid", os.getpid())
    while True: time.sleep(1)
if os.fork() == 0:
    os.setsid()
    publish("grandchild.pid", os.getpid())
    while True: time.sleep(1)
publish("worker.pid", os.getpid())
while True: time.sleep(1)
""", nproc=1)
    env = {} if cgroup else {"DDP_NO_CGROUP": "1"}
    p = start_launch(job, env=env)
    pids = {}
    try:
        wait_for(lambda: all((tmp_path / f"{n}.pid").exists() for n in ("worker", "child", "grandchild")),
                 what="worker")
        pids = {n: int((tmp_path / f"{n}.pid").read_text()) for n in ("worker", "child", "grandchild")}
        in_cgroup = "ddpctl-" in open(f"/proc/{pids['grandchild']}/cgroup").read()
        if cgroup and not in_cgroup:
            pytest.skip("no writable cgroup v2 here: the no-cgroup case runs beside this one")
        assert cgroup == in_cgroup
        p.kill()
        p.wait(10)
        wait_for(lambda: not alive(pids["worker"]), what="the worker to die with its launcher (PDEATHSIG)")
        wait_for(lambda: not alive(pids["child"]), timeout=10, what="the guardian to kill the worker's child")
        if cgroup:
            wait_for(lambda: not alive(pids["grandchild"]), timeout=10,
                     what="the guardian to kill the cgroup, a setsid() grandchild too")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
        for pid in pids.values():
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_reader_that_goes_away_does_not_kill_the_launcher(tmp_path):
    # `ddpctl launch job.yaml | grep loss`, then Ctrl-C: grep is gone before ddpctl has stopped
    # the workers. ddpctl must still stop them in order and exit 143, not die of SIGPIPE.
    job = py_job(tmp_path, """
import os, sys, time
open(f"worker-{os.environ['RANK']}.pid", "w").write(str(os.getpid()))
while True:
    print("still training", flush=True)
    time.sleep(0.01)
""")
    p = start_launch(job)
    try:
        wait_for(lambda: len(read_pids(tmp_path)) == 2, what="workers to start")
        log = next(tmp_path.glob("logs/**/rank-0.log"))
        p.stdout.close()  # the reader goes away
        p.stderr.close()
        # ddpctl has handled more output since (it writes each line to the log and the terminal)
        size = log.stat().st_size
        wait_for(lambda: log.stat().st_size > size + 200, what="ddpctl to relay output after the reader left")
        assert p.poll() is None, "ddpctl died when its reader went away"
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 143
        for pid in read_pids(tmp_path):
            assert not alive(pid)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
