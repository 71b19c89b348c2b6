"""Coming from torchrun (issue 25): `ddpctl torchrun` with torchrun's own flags, `ddpctl launch`
without a job file, a free store port when the default is taken, and the messages a new user
meets first. Real PyTorch 1.13 (Debian's, gloo on CPU) runs an unchanged torchrun-style script."""
import json
import os
import subprocess
from pathlib import Path

import pytest

from ddptest import DDPCTL, PYTHON, free_port, wait_for, write_job

# The script a torchrun user already has: env:// and nothing from ddpctl.
SCRIPT = r"""
import argparse, json, os, sys
import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--arg")
p.add_argument("--hold", help="wait for this file before ending (a job that stays up)")
a = p.parse_args()
dist.init_process_group("gloo")
t = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(t)
rank = dist.get_rank()
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
        "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "OMP_NUM_THREADS",
        "TORCHELASTIC_ERROR_FILE")
out = {"env": {k: os.environ.get(k) for k in keys}, "sum": t.item(), "arg": a.arg, "argv": sys.argv,
       "orig_argv": sys.orig_argv[1:]}
tag = os.environ.get("TAG", "")
with open(f"{tag}rank-{rank}.json.tmp", "w") as f:
    json.dump(out, f)
os.rename(f"{tag}rank-{rank}.json.tmp", f"{tag}rank-{rank}.json")
if a.hold:
    import time
    while not os.path.exists(a.hold):  # the test says when (bounded by the test's own timeout)
        time.sleep(0.05)
dist.destroy_process_group()
"""

# Debian's python3 has torch; the first python3 on PATH may be another (pyenv's). A torchrun user
# runs the python3 that has torch: the same here.
ENV = {"PATH": "/usr/bin:/bin", "TORCH_CPP_LOG_LEVEL": "ERROR"}


def run(args, cwd, env=None, timeout=120):
    full = dict(os.environ)
    full.update(ENV)
    full.update(env or {})
    return subprocess.run([DDPCTL, *args], cwd=cwd, env=full, capture_output=True, text=True, timeout=timeout)


def start(args, cwd, env=None):
    full = dict(os.environ)
    full.update(ENV)
    full.update(env or {})
    return subprocess.Popen([DDPCTL, *args], cwd=cwd, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def script(tmp: Path) -> Path:
    s = tmp / "script.py"
    s.write_text(SCRIPT)
    return s


def ranks(tmp: Path, n: int, tag=""):
    return [json.loads((tmp / f"{tag}rank-{i}.json").read_text()) for i in range(n)]


def check_contract(results, n=2):
    for i, r in enumerate(results):
        e = r["env"]
        assert e["RANK"] == str(i) and e["LOCAL_RANK"] == str(i) and e["WORLD_SIZE"] == str(n)
        assert r["sum"] == n * (n + 1) / 2
        assert r["arg"] == "x"


def test_torchrun_standalone_runs_an_unchanged_script(tmp_path):
    script(tmp_path)
    r = run(["torchrun", "--standalone", "--nproc-per-node", "2", "script.py", "--arg", "x"], tmp_path)
    assert r.returncode == 0, r.stderr
    res = ranks(tmp_path, 2)
    check_contract(res)
    assert res[0]["orig_argv"] == ["-u", "script.py", "--arg", "x"]  # as torchrun builds it


def test_torchrun_1_13_spellings(tmp_path):
    script(tmp_path)
    r = run(["torchrun", "--nnodes=1", "--node_rank=0", "--nproc_per_node=2", "--max_restarts=0", "--monitor_interval=1",
             "--rdzv_backend=c10d", "--rdzv_endpoint=localhost:0", "--rdzv_id=abc", "script.py", "--arg", "x"], tmp_path)
    assert r.returncode == 0, r.stderr
    res = ranks(tmp_path, 2)
    check_contract(res)
    assert res[0]["env"]["TORCHELASTIC_RUN_ID"].startswith("abc-")
    assert "--monitor_interval: ignored" in r.stderr  # what changes nothing is said once, not hidden


def test_same_contract_as_debian_torchrun(tmp_path):
    """The same script and flags under Debian's torchrun 1.13 and under ddpctl torchrun: each rank's
    environment contract matches, except the values named here, which must differ."""
    if not Path("/usr/bin/torchrun").exists():
        pytest.fail("Debian's torchrun (python3-torch) is missing: scripts/setup installs it")
    script(tmp_path)
    # Debian's torchrun 1.13 fails on its Python 3.11 before any worker starts: 3.11's IntFlag no
    # longer yields NONE when iterated, so Std.from_str("0") is None. The same torchrun, with that
    # one function mended:
    shim = tmp_path / "torchrun_mended.py"
    shim.write_text(
        "import sys\n"
        "from torch.distributed.elastic.multiprocessing import api\n"
        "def from_str(cls, vm):\n"
        "    if ':' not in vm: return cls(int(vm))\n"
        "    return {int(i): cls(int(v)) for i, v in (m.split(':') for m in vm.split(','))}\n"
        "api.Std.from_str = classmethod(from_str)\n"
        "from torch.distributed.run import main\n"
        "sys.exit(main())\n")
    flags = ["--standalone", "--nproc_per_node", "2", "script.py", "--arg", "x"]
    t = subprocess.run([PYTHON, str(shim), *flags], cwd=tmp_path, env={**os.environ, **ENV, "TAG": "t-"},
                       capture_output=True, text=True, timeout=180)
    assert t.returncode == 0, t.stderr
    r = run(["torchrun", *flags], tmp_path, env={"TAG": "d-"})
    assert r.returncode == 0, r.stderr
    differ = {
        "MASTER_ADDR",                   # torchrun 1.13: the agent's host name; ddpctl: 127.0.0.1, where its store is
        "MASTER_PORT",                   # each picks a free port
        "TORCHELASTIC_RUN_ID",           # a uuid; ddpctl: the job id
        "TORCHELASTIC_ERROR_FILE",       # each launcher's log folder
        "TORCHELASTIC_USE_AGENT_STORE",  # 1.13 with c10d: rank 0 hosts a store; ddpctl serves it ("True")
    }
    for tr, dr in zip(ranks(tmp_path, 2, "t-"), ranks(tmp_path, 2, "d-")):
        for k, v in tr["env"].items():
            if k not in differ:
                assert dr["env"][k] == v, (k, v, dr["env"][k])
        assert dr["env"]["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        assert tr["argv"] == dr["argv"] and tr["orig_argv"] == dr["orig_argv"]
        assert tr["sum"] == dr["sum"] == 3.0


def test_launch_without_a_job_file(tmp_path):
    script(tmp_path)
    r = run(["launch", "-n", "2", "--", "python3", "script.py", "--arg", "x"], tmp_path)
    assert r.returncode == 0, r.stderr
    check_contract(ranks(tmp_path, 2))
    # The first thing a torchrun user types: once "not valid YAML: illegal map value".
    for f in tmp_path.glob("rank-*.json"):
        f.unlink()
    r = run(["launch", "--nproc-per-node", "2", "script.py", "--arg", "x"], tmp_path)
    assert r.returncode == 0, r.stderr
    check_contract(ranks(tmp_path, 2))
    assert "YAML" not in r.stderr
    # A yes/no option just before the script or `--` takes no value: it once swallowed the script
    # (read then as a job file) or left `--` unexpected.
    for f in tmp_path.glob("rank-*.json"):
        f.unlink()
    r = run(["launch", "-n", "2", "-q", "script.py", "--arg", "x"], tmp_path)
    assert r.returncode == 0, r.stderr
    check_contract(ranks(tmp_path, 2))
    r = run(["launch", "-n", "2", "--dry-run", "--", "python3", "script.py"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["ranks"][0]["argv"] == ["python3", "script.py"]


def test_launch_words_refused_clearly(tmp_path):
    job = write_job(tmp_path, "command: [python3, script.py]\n")
    r = run(["launch", str(job), "--", "python3", "other.py"], tmp_path)
    assert r.returncode == 2 and "give one or the other" in r.stderr, r.stderr
    r = run(["launch"], tmp_path)
    assert r.returncode == 2 and "what to run?" in r.stderr, r.stderr
    r = run(["launch", "-n", "0", "--", "python3", "x.py"], tmp_path)
    assert r.returncode == 2 and "nproc-per-node" in r.stderr, r.stderr


def test_two_local_jobs_at_once_both_run(tmp_path):
    """Neither names a port: the second finds the first on 29500 (or both find another process
    there) and takes a free one, as torchrun --standalone would, instead of failing."""
    script(tmp_path)
    first = start(["launch", "-n", "1", "--job-id", "first-job", "--", "python3", "script.py", "--arg", "x",
                   "--hold", "release"], tmp_path, env={"TAG": "a-"})
    try:
        wait_for(lambda: (tmp_path / "a-rank-0.json").exists() or first.poll() is not None, 60, "the first job's rank")
        assert first.poll() is None, first.communicate()[1]
        r = run(["launch", "-n", "1", "--", "python3", "script.py", "--arg", "x"], tmp_path, env={"TAG": "b-"})
        assert r.returncode == 0, r.stderr
        a, b = ranks(tmp_path, 1, "a-")[0], ranks(tmp_path, 1, "b-")[0]
        assert a["env"]["MASTER_PORT"] != b["env"]["MASTER_PORT"]
        if a["env"]["MASTER_PORT"] == "29500":  # then the second met the first there, and said so
            assert "store port 29500 is taken by job first-job" in r.stderr, r.stderr
    finally:
        (tmp_path / "release").write_text("")
        out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    # The same id as a running job: refused before anything starts (both would have written the
    # same log files and answered to the same `ddpctl status`).
    first = start(["launch", "-n", "1", "--job-id", "same-job", "--", "python3", "script.py", "--arg", "x",
                   "--hold", "release2"], tmp_path, env={"TAG": "c-"})
    try:
        wait_for(lambda: (tmp_path / "c-rank-0.json").exists() or first.poll() is not None, 60, "the first job's rank")
        r = run(["launch", "-n", "1", "--job-id", "same-job", "--", "python3", "script.py", "--arg", "x"], tmp_path,
                env={"TAG": "d-"})
        assert r.returncode == 2 and "job same-job is already running here" in r.stderr, r.stderr
        assert not (tmp_path / "d-rank-0.json").exists()
    finally:
        (tmp_path / "release2").write_text("")
        out, err = first.communicate(timeout=60)
    assert first.returncode == 0, err


def test_explicit_port_taken_names_the_job(tmp_path):
    script(tmp_path)
    port = free_port()
    first = start(["launch", "-n", "1", "--master-port", str(port), "--job-id", "holder-job", "--", "python3",
                   "script.py", "--hold", "release"], tmp_path, env={"TAG": "a-"})
    try:
        wait_for(lambda: (tmp_path / "a-rank-0.json").exists() or first.poll() is not None, 60, "the first job's rank")
        assert first.poll() is None, first.communicate()[1]
        r = run(["torchrun", "--master-port", str(port), "script.py"], tmp_path, env={"TAG": "b-"})
        assert r.returncode == 2, r.stderr
        assert f"store port {port} is taken by job holder-job (pid {first.pid}" in r.stderr, r.stderr
        assert r.stderr.count("choose another") == 1, r.stderr  # the advice once
        assert not (tmp_path / "b-rank-0.json").exists()
    finally:
        (tmp_path / "release").write_text("")
        first.communicate(timeout=60)


@pytest.mark.parametrize("args, says", [
    (["--nnodes", "2", "--nproc-per-node", "2"], "--nnodes 2"),
    (["--nnodes=1:2"], "--nnodes 1:2"),
    (["--node_rank", "1", "--nnodes", "1"], "--node_rank 1"),
    (["--rdzv-backend", "c10d", "--rdzv-endpoint", "trainer-node-7:29400"], "trainer-node-7:29400 is not this machine"),
    (["--master_addr", "10.255.255.1"], "10.255.255.1 is not this machine"),
])
def test_torchrun_multi_node_is_refused_with_the_ddpctl_way(tmp_path, args, says):
    r = run(["torchrun", *args, "script.py"], tmp_path)
    assert r.returncode == 2
    assert says in r.stderr and "--nodes" in r.stderr and "--ssh" in r.stderr and "--slurm" in r.stderr, r.stderr


@pytest.mark.parametrize("addr", ["0.0.0.0", "::"])
def test_torchrun_with_the_any_address_runs_here(tmp_path, addr):
    # `--master_addr 0.0.0.0`, a bind-all habit: under torchrun the workers' connects reached
    # this machine, so it is this machine, not a multi-node refusal.
    script(tmp_path)
    r = run(["torchrun", "--nproc-per-node", "2", f"--master_addr={addr}", "script.py"], tmp_path)
    assert r.returncode == 0, r.stderr
    for rank in (0, 1):
        out = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert out["sum"] == 3.0 and out["env"]["MASTER_ADDR"] == "127.0.0.1", out


def test_torchrun_help_and_bad_flags(tmp_path):
    r = run(["torchrun", "--help"], tmp_path)
    assert r.returncode == 0 and "--nproc_per_node" in r.stdout and "--standalone" in r.stdout
    r = run(["torchrun", "--nproc-per-nodes", "2", "script.py"], tmp_path)
    assert r.returncode == 2 and "did you mean --nproc-per-node?" in r.stderr, r.stderr


def test_a_bad_command_line_is_said_as_every_other_error(tmp_path):
    # CLI11's own words, prefixed and pointed at the right --help (they had neither).
    r = run(["launch", "--nosuch", "script.py"], tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr == "ddpctl launch: the following argument was not expected: --nosuch; see ddpctl launch --help\n"
    r = run(["status", "--bogus"], tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("ddpctl status: "), r.stderr


def test_not_executable_and_not_on_path_are_told_apart(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    job = write_job(tmp_path, "command: [./train.py]\n")
    r = run(["launch", str(job)], tmp_path)
    assert r.returncode == 2
    assert "./train.py is not executable (in workdir" in r.stderr, r.stderr
    assert "run it with its interpreter: command: [python3, ./train.py]" in r.stderr
    job = write_job(tmp_path, "command: [train.py]\n", name="bare.yaml")
    r = run(["launch", str(job)], tmp_path)
    assert r.returncode == 2
    assert "train.py is not a program on PATH; it is a file in workdir" in r.stderr, r.stderr
    assert "command: [python3, train.py]" in r.stderr
    r = run(["launch", "--", "train.py"], tmp_path)
    assert r.returncode == 2 and "ddpctl launch [OPTIONS] -- python3 train.py" in r.stderr, r.stderr
    for text in (r.stderr,):
        assert "PATH=" not in text


def test_restart_plural(tmp_path):
    job = write_job(tmp_path, f"command: [{PYTHON}, -c, 'import sys; sys.exit(3)']\nrestart: {{max_restarts: 1, backoff: 10ms}}\n")
    r = run(["launch", str(job), "--master-port", "0"], tmp_path)
    assert r.returncode == 1
    assert "failed after 1 restart" in r.stderr and "1 restarts" not in r.stderr, r.stderr
