"""`ddpctl stacks [JOB]` on a running local job (its control socket; the launcher's WorkerGroup
reads its ranks, lib/stacks/collect.hpp): 4 gloo ranks where rank 1 is stuck in a Python function
while 0, 2 and 3 wait in all_reduce; --json; --ranks; a C worker's native stack through the
privilege-separated reader; and that reader opening the job's files as the job's user, not root.
Every wait is bounded; what a test starts it stops by pid."""
import json
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from ddptest import BINARY_DIR, DDPCTL, start_launch, wait_for, write_job

STUCK_WORKER = BINARY_DIR / "tests" / "stacks_stuck_worker"

WORKER = r'''
import os
import torch
import torch.distributed as dist


def stuck_here():
    r, w = os.pipe()
    os.read(r, 1)  # STUCK_LINE: nobody writes


def step(t):
    dist.all_reduce(t)  # ALL_REDUCE_LINE
    return t


dist.init_process_group("gloo")
print("joined", flush=True)
if dist.get_rank() == 1:
    stuck_here()
else:
    step(torch.ones(4))
'''


def line_of(path: Path, marker: str) -> int:
    return next(n for n, t in enumerate(path.read_text().splitlines(), 1) if marker in t)


@pytest.fixture
def rt(tmp_path):
    d = tmp_path / "rt"
    d.mkdir(mode=0o700)
    return d


def ctl(rt, *args, timeout=120):
    env = dict(os.environ, XDG_RUNTIME_DIR=str(rt))
    return subprocess.run([DDPCTL, *args], env=env, capture_output=True, text=True, timeout=timeout)


def stacks_json(rt, *args):
    r = ctl(rt, "stacks", "--json", *args)
    return json.loads(r.stdout) if r.stdout.strip() else {"error": r.stderr}


def stop(p):
    if p.poll() is None:
        p.kill()  # ddpctl launch: its workers die with it (and its process group is ours)
    p.communicate(timeout=60)


def main_top(proc):
    main = next((t for t in proc["threads"] if t["main"]), None)
    return main["python"][0]["function"] if main and main["python"] else None


def hung(j):
    """Rank 1 in stuck_here, the others in all_reduce (their main threads)."""
    procs = {p["rank"]: p for p in j.get("processes", [])}
    return len(procs) == 4 and main_top(procs[1]) == "stuck_here" and all(
        main_top(procs[r]) == "all_reduce" for r in (0, 2, 3))


@pytest.fixture
def hang(tmp_path, rt):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    job = write_job(tmp_path, f"name: hang\nnproc_per_node: 4\ncommand: [/usr/bin/python3, {worker}]\n"
                              "env: {GLOO_SOCKET_IFNAME: lo, OMP_NUM_THREADS: '1'}\n"
                              "stop: {grace: 2s}\nnccl: {unique_id: off}\n")
    p = start_launch(job, "-q", "--job-id", "hang-1", env={"XDG_RUNTIME_DIR": str(rt)})
    try:
        last = {}

        def settled():
            last["j"] = stacks_json(rt, "hang-1")
            return hung(last["j"])
        wait_for(settled, timeout=120, what="rank 1 to be stuck and the others to wait in all_reduce")
        yield worker, last["j"]
    finally:
        stop(p)


def test_the_stuck_rank_comes_first_and_the_others_are_in_the_collective(rt, hang):
    worker, _ = hang
    r = ctl(rt, "stacks", "hang-1")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    # The odd rank first: rank 1, in stuck_here at its line.
    assert lines[0].startswith("rank 1 (1 of 4)"), r.stdout
    assert lines[1] == f"    stuck_here ({worker}:{line_of(worker, 'STUCK_LINE')})", r.stdout
    # Ranks 0, 2 and 3 share one group, in all_reduce called from step().
    header = next((i for i, l in enumerate(lines) if l.startswith("ranks 0,2,3 (3 of 4)")), None)
    assert header is not None, r.stdout
    assert lines[header + 1].startswith("    all_reduce ("), r.stdout
    assert f"    step ({worker}:{line_of(worker, 'ALL_REDUCE_LINE')})" in lines[header + 1:header + 6], r.stdout


def test_json_shape(rt, hang):
    _, j = hang
    assert j["job_id"] == "hang-1" and j["world_size"] == 4
    assert sorted(p["rank"] for p in j["processes"]) == [0, 1, 2, 3]
    for p in j["processes"]:
        assert p["node"] == "" and p["pid"] > 0 and p["python_ok"], p
    first = j["groups"][0]
    assert first["ranks"] == [1] and first["python"][0]["function"] == "stuck_here", first
    collective = next(g for g in j["groups"] if g["python"] and g["python"][0]["function"] == "all_reduce")
    assert collective["ranks"] == [0, 2, 3] and collective["ranks_text"] == "0,2,3"


def test_ranks_filter(rt, hang):
    j = stacks_json(rt, "hang-1", "--ranks", "0,2-3")
    assert sorted(p["rank"] for p in j["processes"]) == [0, 2, 3]
    assert all(1 not in g["ranks"] for g in j["groups"])
    assert j["groups"] and all(main_top(p) == "all_reduce" for p in j["processes"])
    r = ctl(rt, "stacks", "hang-1", "--ranks", "9")
    assert r.returncode == 1 and "the job has no rank 9 (it has ranks 0-3)" in r.stderr, r.stderr


def test_native_stack_of_a_c_worker_through_the_job(tmp_path, rt):
    assert STUCK_WORKER.exists(), f"{STUCK_WORKER} is not built (cmake --build build --target stacks_stuck_worker)"
    job = write_job(tmp_path, f"name: cjob\nnproc_per_node: 2\ncommand: [{STUCK_WORKER}]\n"
                              "stop: {grace: 2s}\nnccl: {unique_id: off}\n")
    p = start_launch(job, "-q", "--job-id", "cjob-1", env={"XDG_RUNTIME_DIR": str(rt)})
    try:
        last = {}

        def named():
            last["j"] = stacks_json(rt, "cjob-1", "--native")
            return len(last["j"].get("groups", [])) > 0 and all(
                any(f["function"] == "stuck_in_c_function" for t in pr["threads"] if t["main"] for f in t["native"])
                for pr in last["j"]["processes"]) and len(last["j"]["processes"]) == 2
        wait_for(named, timeout=60, what="both C ranks' native stacks to name stuck_in_c_function")
        j = last["j"]
        g = j["groups"][0]
        assert g["ranks"] == [0, 1], j["groups"]  # one group: the same native stack
        names = [f["function"] for f in g["native"]]
        assert names.index("stuck_in_c_function") < names.index("main"), names
        assert g["native"][names.index("stuck_in_c_function")]["module"] == "stacks_stuck_worker"
        # Without --native: no Python here, and it says so.
        r = ctl(rt, "stacks", "cjob-1")
        assert "not a Python process: only native stacks are available (--native)" in r.stdout, r.stdout
    finally:
        stop(p)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the reader drops from root to the target's user")
def test_the_native_reader_opens_the_targets_files_as_its_user_not_root(tmp_path):
    """A root caller's reader drops to the target's user before libdw opens the target's files:
    a binary that only root may read (made so after the target started from it) is not opened,
    so its functions have no names; readable again, they do. Root reading in-process (the code
    before collect.hpp) names them both times."""
    assert STUCK_WORKER.exists()
    d = Path(tempfile.mkdtemp(prefix="ddp-stacks-drop-", dir="/var/tmp"))
    try:
        os.chmod(d, 0o755)
        exe = d / "stacks_stuck_worker"
        shutil.copy2(STUCK_WORKER, exe)
        os.chmod(exe, 0o755)
        t = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(exe)],
                             stdout=subprocess.PIPE, text=True)
        try:
            assert t.stdout.readline().strip() == "ready"

            def native_names():
                r = subprocess.run([DDPCTL, "stacks", "--pid", str(t.pid), "--native", "--json"],
                                   capture_output=True, text=True, timeout=120)
                proc = json.loads(r.stdout)["processes"][0]
                main = next(th for th in proc["threads"] if th["main"])
                return [f["function"] for f in main["native"]], [f["module"] for f in main["native"]], proc

            wait_for(lambda: "stuck_in_c_function" in native_names()[0], timeout=30,
                     what="the target to be in stuck_in_c_function")
            os.chmod(exe, 0o700)  # root's alone now; the target's mapping stays
            names, modules, proc = native_names()
            assert "stuck_in_c_function" not in names, (names, proc["errors"])
            assert "stacks_stuck_worker" in modules, modules  # the frame is there, unnamed
            assert names[0] in ("pause", "__libc_pause", "__GI___libc_pause"), names  # libc: readable to all
            os.chmod(exe, 0o755)
            names, _, _ = native_names()
            assert "stuck_in_c_function" in names, names
        finally:
            t.kill()
            t.wait(timeout=30)
    finally:
        shutil.rmtree(d, ignore_errors=True)
