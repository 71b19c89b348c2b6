#!/usr/bin/env python3
"""How long a stack read stops its target, and what it costs the reader (lib/stacks through
`ddpctl stacks --pid --json`). Builds nothing: run scripts/build first.

  Python: READS reads of a Python 3.11 process with THREADS parked threads DEPTH frames deep;
          expected stop: none (process_vm_readv only).
  native: the same with --native (libdw; each thread ptrace-stopped in turn while unwound).

Reports the reader's time per process (median, p90, max; measured inside ddpctl, without its
start-up), the ptrace stop window per thread as the reader measures it (from PTRACE_INTERRUPT to
PTRACE_DETACH: an upper bound, since it includes the reader's own wake-up), and, from the
target's own view, the longest gap of its spinning thread that overlaps a read of it. The
control: each read of the target alternates with the same read of a second, identical process,
and the spinner's longest gap during those reads is the machine's scheduling noise under the
same load (on a loaded machine it is not zero). Environment: BUILD_DIR or DDPCTL, PYTHON (default
/usr/bin/python3.11), READS (20), THREADS (8), DEPTH (30)."""
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

root = Path(__file__).resolve().parents[2]
build = Path(os.environ.get("BUILD_DIR", root / "build"))
ddpctl = Path(os.environ.get("DDPCTL", build / "bin" / "ddpctl"))
python = os.environ.get("PYTHON", "/usr/bin/python3.11")
reads = int(os.environ.get("READS", "20"))
if not ddpctl.exists():
    sys.exit(f"run.py: {ddpctl} is missing; run scripts/build first")


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def allow_tracers():
    """With Yama's ptrace_scope at 1 and no CAP_SYS_PTRACE (a container's root, usually), only an
    ancestor may read a process, and ddpctl is the targets' sibling: they name any process as
    their tracer instead (the bench measures the reader, not the policy)."""
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(0x59616D61, ctypes.c_ulong(2**64 - 1), 0, 0, 0)  # PR_SET_PTRACER_ANY


def read(pid: int, native: bool):
    argv = [str(ddpctl), "stacks", "--json", "--pid", str(pid)] + (["--native"] if native else [])
    t0 = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    t1 = time.monotonic()
    if r.returncode != 0:
        sys.exit(f"run.py: ddpctl stacks failed: {r.stderr}")
    return (t0, t1), json.loads(r.stdout)["processes"][0]


def longest_gap(gaps, windows):
    return max((ms for start, ms in gaps if any(s <= start + ms / 1e3 and start <= e for s, e in windows)), default=0.0)


def run(native: bool):
    script = str(Path(__file__).with_name("target.py"))
    target, control = (subprocess.Popen([python, script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        preexec_fn=allow_tracers)
                       for _ in range(2))
    try:
        assert target.stdout.readline().strip() == "ready" and control.stdout.readline().strip() == "ready"
        windows, control_windows, read_ms, stop_max, stop_total, per_thread, nthreads, frames = [], [], [], [], [], [], 0, 0
        for _ in range(reads):
            control_windows.append(read(control.pid, native)[0])
            window, p = read(target.pid, native)
            windows.append(window)
            read_ms.append(p["timing"]["read_ms"])
            stop_max.append(p["timing"]["native_stop_max_ms"])
            stop_total.append(p["timing"]["native_stop_total_ms"])
            per_thread += [t["native_stop_ms"] for t in p["threads"] if native]
            nthreads = len(p["threads"])
            frames = sum(len(t["python"]) + len(t["native"]) for t in p["threads"])
        target.stdin.close()
        control.stdin.close()
        out = target.stdout.read()
        target.wait(timeout=60)
        control.wait(timeout=60)
    finally:
        for proc in (target, control):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    gaps = [(float(a), float(b)) for _, a, b in (line.split() for line in out.splitlines() if line.startswith("gap "))]
    return {
        "mode": "native" if native else "python",
        "threads": nthreads,
        "frames": frames,
        "reads": reads,
        "read_ms": {"median": statistics.median(read_ms), "p90": pct(read_ms, 90), "max": max(read_ms)},
        "ptrace_stop_per_thread_ms": {"median": statistics.median(per_thread or [0]), "p90": pct(per_thread or [0], 90),
                                      "max": max(per_thread or [0])},
        "ptrace_stop_longest_thread_per_read_ms_median": statistics.median(stop_max),
        "ptrace_stop_all_threads_ms_median": statistics.median(stop_total),
        "target_longest_gap_in_a_read_ms": longest_gap(gaps, windows),
        "target_longest_gap_in_a_control_read_ms": longest_gap(gaps, control_windows),
    }


results = [run(False), run(True)]
load = os.getloadavg()[0]
print(f"# {python}, {os.environ.get('THREADS', '8')} parked threads {os.environ.get('DEPTH', '30')} frames deep + 1 spinning; "
      f"{reads} reads each; load average {load:.1f} on {os.cpu_count()} cores")
for r in results:
    print(f"{r['mode']:6}  threads {r['threads']:3}  frames {r['frames']:5}  "
          f"read ms median {r['read_ms']['median']:.2f} p90 {r['read_ms']['p90']:.2f} max {r['read_ms']['max']:.2f}  |  "
          f"ptrace stop per thread ms (all threads of all reads) median {r['ptrace_stop_per_thread_ms']['median']:.2f} "
          f"p90 {r['ptrace_stop_per_thread_ms']['p90']:.2f} max {r['ptrace_stop_per_thread_ms']['max']:.2f}  |  "
          f"target's longest gap: in a read of it {r['target_longest_gap_in_a_read_ms']:.2f} ms, "
          f"in a read of the control {r['target_longest_gap_in_a_control_read_ms']:.2f} ms")
if "--json" in sys.argv:
    print(json.dumps(results, indent=2))
