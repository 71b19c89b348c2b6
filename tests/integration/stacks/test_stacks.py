"""The stack reader (lib/stacks) on real processes, through `ddpctl stacks --pid`: a Python
3.11 process with several threads (file:line of the one stuck), the same with native frames
(ptrace, and the process healthy afterwards), a C++ program's native stack, and two gloo ranks
where one waits in all_reduce while the other is stuck. Each target blocks in a known system
call; the test waits for the kernel to show that (/proc/PID/task/TID/syscall), then reads once."""
import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ddptest import BINARY_DIR, DDPCTL, SOURCE_DIR, free_port, wait_for

HERE = SOURCE_DIR / "tests" / "integration" / "stacks"
THREADS = HERE / "threads_target.py"
GLOO = HERE / "gloo_rank.py"
NATIVE = BINARY_DIR / "tests" / "stacks_native_target"
SYS_READ, SYS_FUTEX = "0", "202"  # x86-64 numbers, as /proc/PID/task/TID/syscall shows them

pytestmark = pytest.mark.skipif(os.uname().machine != "x86_64", reason="the syscall numbers above are x86-64's")


def line_of(path: Path, marker: str) -> int:
    for n, text in enumerate(path.read_text().splitlines(), 1):
        if marker in text:
            return n
    raise AssertionError(f"{marker} not in {path}")


def syscall_of(pid: int, tid: int) -> str:
    try:
        return Path(f"/proc/{pid}/task/{tid}/syscall").read_text().split()[0]
    except (OSError, IndexError):
        return "gone"


def tids(pid: int):
    return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))


class Target:
    """A started process holding the read end of a pipe (the test keeps the write end): a byte
    written releases it. Stopped by pid at the end of the test."""

    def __init__(self, argv, env=None, fd_in_argv=False):
        self.r, self.w = os.pipe()
        full_env = dict(os.environ, STACKS_TEST_FD=str(self.r), **(env or {}))
        if fd_in_argv:
            argv = [*argv, str(self.r)]
        self.proc = subprocess.Popen(argv, pass_fds=(self.r,), env=full_env, stdout=subprocess.PIPE, text=True)
        os.close(self.r)
        self.pid = self.proc.pid

    def wait_line(self, want: str):
        line = self.proc.stdout.readline().strip()
        assert line == want, f"pid {self.pid} said {line!r}, expected {want!r} (exit code {self.proc.poll()})"

    def release(self):
        os.write(self.w, b"x")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        os.close(self.w)


@pytest.fixture
def targets():
    started = []
    yield lambda *a, **k: started.append(Target(*a, **k)) or started[-1]
    for t in started:
        t.stop()


def stacks(*pids, native=False, main_only=False):
    argv = [DDPCTL, "stacks", "--json"]
    for p in pids:
        argv += ["--pid", str(p)]
    if native:
        argv.append("--native")
    if main_only:
        argv.append("--main-thread")
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def pythons():
    """Debian's 3.11 (required), and any 3.12 this machine has (the H200's venv is checked by
    tests/gpu/stacks_on_h200.sh)."""
    found = [pytest.param("/usr/bin/python3.11", id="3.11")]
    p312 = None
    for cand in [shutil.which("python3.12"), *sorted(glob.glob("/root/.pyenv/versions/3.12*/bin/python3.12"))]:
        ok = cand and subprocess.run([cand, "-c", "import sys; assert sys.version_info[:2] == (3, 12)"],
                                     capture_output=True, timeout=60).returncode == 0
        if ok:  # (a pyenv shim is on PATH but may not run)
            p312 = cand
            break
    found.append(pytest.param(p312, id="3.12", marks=pytest.mark.skipif(not p312, reason="no python3.12 on this machine")))
    return found


def other_pythons():
    """Interpreters whose frames are not read (3.10, 3.13), where this machine has them."""
    found = []
    for minor in (10, 13):
        cands = sorted(glob.glob(f"/root/.pyenv/versions/3.{minor}*/bin/python3.{minor}")) + [f"/usr/bin/python3.{minor}"]
        p = next((c for c in cands if os.access(c, os.X_OK)), None)
        found.append(pytest.param(p, id=f"3.{minor}", marks=pytest.mark.skipif(not p, reason=f"no python3.{minor} on this machine")))
    return found


def start_threads_target(targets, python):
    t = targets([python, str(THREADS)])
    t.wait_line("ready")
    # Every thread parked: main in read(2) on the pipe, the three workers in futex(2).
    wait_for(lambda: len(tids(t.pid)) == 4 and syscall_of(t.pid, t.pid) == SYS_READ
             and all(syscall_of(t.pid, x) == SYS_FUTEX for x in tids(t.pid) if x != t.pid),
             what=f"pid {t.pid}'s threads to block")
    return t


@pytest.mark.parametrize("python", pythons())
def test_every_python_thread_with_file_and_line(targets, python):
    t = start_threads_target(targets, python)
    j = stacks(t.pid)
    proc = j["processes"][0]
    want_version = "3.11." if python.endswith("3.11") else "3.12."
    assert proc["python_ok"] and proc["python"].startswith(want_version), proc
    assert proc["timing"]["native_stop_max_ms"] == 0  # a Python read never stops the target
    main = next(th for th in proc["threads"] if th["main"])
    assert main["tid"] == t.pid
    assert main["python"][0] == {"function": "stuck_here", "file": str(THREADS), "line": line_of(THREADS, "STUCK_LINE")}
    assert main["python"][1]["function"] == "main"
    assert main["python"][-1]["function"] == "<module>"
    workers = [th for th in proc["threads"] if not th["main"]]
    assert len(workers) == 3
    for w in workers:
        frames = [f["function"] for f in w["python"]]
        assert "worker_wait" in frames, w
        ww = w["python"][frames.index("worker_wait")]
        assert (ww["file"], ww["line"]) == (str(THREADS), line_of(THREADS, "WORKER_LINE"))
        assert frames[frames.index("worker_wait") - 1].endswith("wait")  # Event.wait, innermost of it
    # Merged: the stuck main thread first, then one group of the three identical workers.
    groups = j["groups"]
    assert [len(g["members"]) for g in groups] == [1, 3]
    assert groups[0]["python"][0]["function"] == "stuck_here"
    # The text form says the same, first line first.
    r = subprocess.run([DDPCTL, "stacks", "--pid", str(t.pid)], capture_output=True, text=True, timeout=60)
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"rank 0 (1 of 1), thread ") and lines[0].endswith(f"(tid {t.pid}):"), r.stdout
    assert lines[1] == f"    stuck_here ({THREADS}:{line_of(THREADS, 'STUCK_LINE')})", r.stdout


def test_native_frames_of_a_python_process_and_it_runs_on(targets):
    t = start_threads_target(targets, "/usr/bin/python3.11")
    j = stacks(t.pid, native=True)
    proc = j["processes"][0]
    main = next(th for th in proc["threads"] if th["main"])
    assert main["python"][0]["function"] == "stuck_here"
    natives = [f["function"] for f in main["native"]]
    assert natives and natives[0] in ("read", "__libc_read", "__GI___libc_read"), natives
    assert any(f["module"].startswith("python3.11") for f in main["native"]), main["native"]
    assert "_PyEval_EvalFrameDefault" in natives
    for w in (th for th in proc["threads"] if not th["main"]):
        assert any(f["function"] in ("start_thread",) for f in w["native"]), w["native"]
    assert 0 < proc["timing"]["native_stop_max_ms"] < 1000, proc["timing"]  # measured; bench/stacks reports it
    # ptrace attached and detached every thread: released, the process finishes normally.
    t.release()
    assert t.proc.wait(timeout=30) == 0


def test_native_stack_of_a_cpp_program(targets):
    assert NATIVE.exists(), f"{NATIVE} is not built (cmake --build build --target stacks_native_target)"
    t = targets([str(NATIVE)], fd_in_argv=True)
    t.wait_line("ready")
    wait_for(lambda: len(tids(t.pid)) == 3 and syscall_of(t.pid, t.pid) == SYS_READ
             and all(syscall_of(t.pid, x) == SYS_FUTEX for x in tids(t.pid) if x != t.pid),
             what=f"pid {t.pid}'s threads to block")
    j = stacks(t.pid, native=True)
    proc = j["processes"][0]
    assert not proc["python_ok"] and "only native stacks" in proc["python"], proc["python"]
    main = next(th for th in proc["threads"] if th["main"])
    names = [f["function"] for f in main["native"]]
    leaf = names.index("ddp_stacks_test::stuck_in_native_leaf(int)")
    assert names[leaf + 1] == "ddp_stacks_test::native_middle(int)", names
    assert names[leaf + 2] == "main", names
    assert main["native"][leaf]["module"] == "stacks_native_target"
    groups = j["groups"]
    assert [len(g["members"]) for g in groups] == [1, 2]
    assert any(f["function"] == "ddp_stacks_test::waiting_worker(int)" for f in groups[1]["native"]), groups[1]
    # Without --native the reader says why there is nothing, rather than nothing.
    r = subprocess.run([DDPCTL, "stacks", "--pid", str(t.pid)], capture_output=True, text=True, timeout=60)
    assert r.stdout.splitlines()[1] == "    not a Python process: only native stacks are available (--native)", r.stdout
    t.release()
    assert t.proc.wait(timeout=30) == 0


def test_gloo_rank_in_all_reduce_and_the_stuck_rank(targets):
    port = free_port()
    env = {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    ranks = [targets(["/usr/bin/python3.11", str(GLOO), str(k), str(port)], env=env) for k in (0, 1)]
    for t in ranks:
        t.wait_line("joined")
    wait_for(lambda: syscall_of(ranks[0].pid, ranks[0].pid) == SYS_FUTEX and syscall_of(ranks[1].pid, ranks[1].pid) == SYS_READ,
             timeout=60, what="rank 0 to wait in all_reduce and rank 1 to block")
    j = stacks(ranks[0].pid, ranks[1].pid, main_only=True)
    groups = j["groups"]
    assert [g["ranks"] for g in groups] == [[0], [1]]
    top0 = groups[0]["python"]
    assert top0[0]["function"] == "all_reduce" and top0[0]["file"].endswith("torch/distributed/distributed_c10d.py"), top0
    # The caller: the first frame of the script's own (PyTorch 2.x puts a logging wrapper between).
    caller = next(f for f in top0 if f["file"] == str(GLOO))
    assert caller == {"function": "step", "file": str(GLOO), "line": line_of(GLOO, "ALL_REDUCE_LINE")}
    assert groups[1]["python"][0] == {"function": "stuck_here", "file": str(GLOO), "line": line_of(GLOO, "STUCK_LINE")}


def test_a_process_that_is_gone_is_named_with_why(targets):
    t = targets([sys.executable, "-c", "pass"])
    t.proc.wait(timeout=30)
    r = subprocess.run([DDPCTL, "stacks", "--pid", str(t.pid)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "the process is gone" in r.stdout, r.stdout


def yama_scope() -> int:
    try:
        return int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text())
    except OSError:
        return 0  # no Yama: the classic rule (same uid, dumpable target)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the target and the reader as other users")
def test_as_the_jobs_user_and_as_another_user(targets):
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    t = targets([*nobody, "/usr/bin/python3.11", str(THREADS)])
    t.wait_line("ready")
    wait_for(lambda: len(tids(t.pid)) == 4 and syscall_of(t.pid, t.pid) == SYS_READ, what="the target to block")
    # Same user as the target: allowed by the kernel's ptrace rule (unless Yama restricts it).
    r = subprocess.run([*nobody, DDPCTL, "stacks", "--pid", str(t.pid), "--native"], capture_output=True, text=True, timeout=120)
    if yama_scope() == 0:
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines()[1] == f"    stuck_here ({THREADS}:{line_of(THREADS, 'STUCK_LINE')})", r.stdout
        assert "native:" in r.stdout and "cannot ptrace" not in r.stderr, r.stderr
    else:
        assert "ptrace_scope" in r.stdout + r.stderr, r.stdout + r.stderr
    # Another user: refused, and the message says what is needed.
    daemon = ["setpriv", "--reuid=1", "--regid=1", "--clear-groups"]
    r = subprocess.run([*daemon, DDPCTL, "stacks", "--pid", str(t.pid)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stdout
    assert "Permission denied" in r.stdout and "needs root, or the same user" in r.stdout, r.stdout


@pytest.mark.parametrize("python", other_pythons())
def test_other_versions_say_only_native_stacks(targets, python):
    t = start_threads_target(targets, python)
    j = stacks(t.pid)
    proc = j["processes"][0]
    assert not proc["python_ok"]
    assert "only native stacks are available (--native)" in proc["python"], proc["python"]
    assert all(not th["python"] for th in proc["threads"])
    assert j["groups"][0]["note"] == proc["python"]
    j = stacks(t.pid, native=True)  # and the native stacks are there
    main = next(th for th in j["processes"][0]["threads"] if th["main"])
    assert any(f["function"] in ("read", "__libc_read") for f in main["native"][:2]), main["native"][:3]
    t.release()
