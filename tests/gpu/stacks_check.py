"""The stack reader with another Python (the H200's venv, 3.12): tests/integration/stacks'
targets run with that interpreter, read from outside by ddpctl (built on Debian, run here).
Prints one "ok:"/"FAIL:" line per check and exits non-zero on any failure.
usage: stacks_check.py DDPCTL PYTHON"""
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ddpctl, python = sys.argv[1], sys.argv[2]
here = Path(__file__).resolve().parents[1] / "integration" / "stacks"
THREADS, GLOO = here / "threads_target.py", here / "gloo_rank.py"
failed = []


def check(ok, what, detail=""):
    print(("ok: " if ok else "FAIL: ") + what + ("" if ok else f"\n    {detail}"), flush=True)
    if not ok:
        failed.append(what)


def line_of(path, marker):
    return next(n for n, t in enumerate(path.read_text().splitlines(), 1) if marker in t)


def syscall_of(pid, tid):
    try:
        return Path(f"/proc/{pid}/task/{tid}/syscall").read_text().split()[0]
    except (OSError, IndexError):
        return "gone"


def wait_for(pred, what, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise SystemExit(f"FAIL: timed out waiting for {what}")


def yama_scope():
    try:
        return int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text())
    except OSError:
        return 0


def has_cap_sys_ptrace():
    caps = next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("CapEff:"))
    return bool(int(caps.split()[1], 16) & (1 << 19))


# ddpctl is not the targets' ancestor here: with Yama at 1 and no CAP_SYS_PTRACE (a container's
# root usually lacks it), the kernel refuses the read. The targets then name any process as
# their tracer (PR_SET_PTRACER_ANY) so that the reader itself is checked; the line below says
# so, because a real job on such a machine needs the agent's shepherd (an ancestor) or root
# with CAP_SYS_PTRACE (docs/architecture.md).
allow_any = yama_scope() == 1 and not has_cap_sys_ptrace()
print(f"ptrace: yama scope {yama_scope()}, CAP_SYS_PTRACE {'yes' if has_cap_sys_ptrace() else 'no'}"
      + ("; targets set PR_SET_PTRACER_ANY for this check" if allow_any else ""))
if yama_scope() >= 2 and not has_cap_sys_ptrace():
    raise SystemExit("FAIL: kernel.yama.ptrace_scope >= 2 and no CAP_SYS_PTRACE: no process may read another here")


def allow_tracers():
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(0x59616D61, ctypes.c_ulong(2**64 - 1), 0, 0, 0)  # PR_SET_PTRACER_ANY


def start(argv, env=None):
    r, w = os.pipe()
    p = subprocess.Popen(argv, pass_fds=(r,), stdout=subprocess.PIPE, text=True,
                         preexec_fn=allow_tracers if allow_any else None,
                         env=dict(os.environ, STACKS_TEST_FD=str(r), **(env or {})))
    os.close(r)
    return p, w


def stacks(*pids, native=False):
    argv = [ddpctl, "stacks", "--json"] + [a for p in pids for a in ("--pid", str(p))] + (["--native"] if native else [])
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: {' '.join(argv)} exited {r.returncode}: {r.stderr}")
    return json.loads(r.stdout)


version = subprocess.run([python, "-c", "import sys; print('%d.%d.%d' % sys.version_info[:3])"],
                         capture_output=True, text=True).stdout.strip()
print(f"python: {python} {version}")

# 1. Threads: the main thread in stuck_here() at its line, three workers in worker_wait().
p, w = start([python, str(THREADS)])
try:
    assert p.stdout.readline().strip() == "ready"
    wait_for(lambda: syscall_of(p.pid, p.pid) == "0" and len(os.listdir(f"/proc/{p.pid}/task")) == 4
             and all(syscall_of(p.pid, int(t)) == "202" for t in os.listdir(f"/proc/{p.pid}/task") if int(t) != p.pid),
             "the threads target to block")
    for native in (False, True):
        j = stacks(p.pid, native=native)
        proc = j["processes"][0]
        tag = "--native" if native else "python only"
        check(proc["python_ok"] and proc["python"] == version, f"[{tag}] Python version read: {proc['python']}", proc)
        main = next(t for t in proc["threads"] if t["main"])
        want = {"function": "stuck_here", "file": str(THREADS), "line": line_of(THREADS, "STUCK_LINE")}
        check(main["python"][:1] == [want], f"[{tag}] main thread in stuck_here at {THREADS.name}:{want['line']}", main["python"][:3])
        workers = [t for t in proc["threads"] if not t["main"]]
        ww = [f for t in workers for f in t["python"] if f["function"] == "worker_wait"]
        check(len(ww) == 3 and all(f["line"] == line_of(THREADS, "WORKER_LINE") for f in ww),
              f"[{tag}] three workers in worker_wait", ww)
        print(f"    timing: {proc['timing']}")
        if native:
            natives = [f["function"] for f in main["native"]]
            check(natives[:1] in (["read"], ["__libc_read"]), "[--native] main thread's innermost native frame is read", natives[:5])
    os.write(w, b"x")
    check(p.wait(timeout=30) == 0, "the target ran on and exited 0 after the reads")
finally:
    if p.poll() is None:
        p.kill()
        p.wait()

# 2. Two gloo ranks on this Python's torch: rank 0 in all_reduce called from step(), rank 1 stuck.
s = socket.socket()
s.bind(("127.0.0.1", 0))
port = s.getsockname()[1]
s.close()
ranks = [start([python, str(GLOO), str(k), str(port)], env={"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}) for k in (0, 1)]
try:
    for rp, _ in ranks:
        assert rp.stdout.readline().strip() == "joined"
    wait_for(lambda: syscall_of(ranks[0][0].pid, ranks[0][0].pid) == "202" and syscall_of(ranks[1][0].pid, ranks[1][0].pid) == "0",
             "rank 0 in all_reduce and rank 1 blocked")
    j = stacks(ranks[0][0].pid, ranks[1][0].pid)
    mains = {g["ranks"][0]: g["python"] for g in j["groups"] if g["members"][0]["rank"] in (0, 1) and any(m["tid"] == m["pid"] for m in g["members"])}
    r0, r1 = mains.get(0, []), mains.get(1, [])
    caller = next((f for f in r0 if f["file"] == str(GLOO)), None)
    check(r0[:1] and r0[0]["function"] == "all_reduce" and caller == {"function": "step", "file": str(GLOO), "line": line_of(GLOO, "ALL_REDUCE_LINE")},
          "rank 0 in all_reduce, called from step()", r0[:5])
    check(r1[:1] == [{"function": "stuck_here", "file": str(GLOO), "line": line_of(GLOO, "STUCK_LINE")}], "rank 1 in stuck_here()", r1[:3])
    first = subprocess.run([ddpctl, "stacks", "--main-thread", "--pid", str(ranks[0][0].pid), "--pid", str(ranks[1][0].pid)],
                           capture_output=True, text=True, timeout=120).stdout
    print(first)
finally:
    for rp, _ in ranks:
        rp.kill()
        rp.wait()

print("stacks_check: " + ("PASS" if not failed else f"FAIL ({len(failed)}: {', '.join(failed)})"))
sys.exit(1 if failed else 0)
