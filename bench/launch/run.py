#!/usr/bin/python3
"""Launch overhead: ddpctl against torchrun, side by side in one run, as ratios.

N trivial workers (/bin/true, N = 1, 4, 16) started by
  - the floor: a shell forking them all at once, `sh -c '/bin/true & ... wait'`,
  - ddpctl launch (store served, NCCL id made when libnccl is present: `nccl.unique_id: auto`),
  - ddpctl launch with nccl.unique_id: off,
  - Debian's torchrun 1.13 (`--standalone --no_python`; Python 3.11 needs `--redirects 1 --tee 1`
    to avoid its Std.from_str crash, and we pass `--monitor_interval 0.1`, its fastest setting;
    the default 5 s poll would make it look far worse).
Wall time is the median of R runs (each including GNU time's own start, the same for all);
peak RSS is the largest resident set in the launcher's process tree as GNU time reports it
(%M), which for /bin/true workers is the launcher itself.

Usage: bench/launch/run.py [--repeats R] [--ddpctl build/bin/ddpctl]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def measure(argv, cwd, env=None):
    # GNU time (a small C program) forks the launcher, so its peak RSS is the launcher's own; a
    # fork from this Python process would carry Python's RSS into the child's high-water mark.
    out = Path(cwd) / "time.out"
    t0 = time.perf_counter()
    rc = subprocess.call(["/usr/bin/time", "-f", "%M", "-o", str(out), *argv], cwd=cwd, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"{argv[0]} failed with {rc}: {' '.join(argv)}")
    return wall, int(out.read_text().split()[-1]) / 1024.0  # MiB


def run(label, argv, cwd, repeats, env=None):
    walls, rss = [], []
    measure(argv, cwd, env)  # warm the page cache
    for _ in range(repeats):
        w, r = measure(argv, cwd, env)
        walls.append(w)
        rss.append(r)
    return {"label": label, "wall_ms": statistics.median(walls) * 1000, "rss_mib": max(rss)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--torchrun-repeats", type=int, default=3)
    ap.add_argument("--ddpctl", default=str(ROOT / "build" / "bin" / "ddpctl"))
    ap.add_argument("--python", default="/usr/bin/python3", help="the interpreter whose torchrun is measured")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="ddp-bench-"))
    # XDG_STATE_HOME: the ended jobs' records stay with the run's files, not in the user's state folder.
    env = dict(os.environ, DDP_LOG_LEVEL="warn", XDG_STATE_HOME=str(tmp / "state"))
    print(f"# launch of N /bin/true workers; median of {args.repeats} (torchrun: {args.torchrun_repeats}) runs")
    print(f"# machine: {os.cpu_count()} CPUs, {os.uname().release}")
    print()
    print(f"| N | floor (sh fork+exec) | ddpctl | ddpctl, no NCCL id | torchrun | ddpctl / torchrun (wall) | ddpctl / torchrun (RSS) |")
    print(f"|---|---|---|---|---|---|---|")
    for n in (1, 4, 16):
        for nccl in ("auto", "off"):
            (tmp / f"job-{n}-{nccl}.yaml").write_text(
                f"nproc_per_node: {n}\ncommand: [/bin/true]\nlogs: {{dir: {tmp}/logs}}\nnccl: {{unique_id: {nccl}}}\n")
        floor = run("floor", ["/bin/sh", "-c", " ".join(["/bin/true &"] * n) + " wait"], tmp, args.repeats)
        ours = run("ddpctl", [args.ddpctl, "launch", "-q", "--master-port", "0", f"job-{n}-auto.yaml"], tmp,
                   args.repeats, env)
        ours_off = run("ddpctl", [args.ddpctl, "launch", "-q", "--master-port", "0", f"job-{n}-off.yaml"], tmp,
                       args.repeats, env)
        theirs = run("torchrun", [args.python, "-m", "torch.distributed.run", "--standalone",
                                  "--nproc_per_node", str(n), "--no_python", "--redirects", "1", "--tee", "1",
                                  "--monitor_interval", "0.1", "--log_dir", str(tmp / "tr"), "/bin/true"],
                     tmp, args.torchrun_repeats)
        fmt = lambda r: f"{r['wall_ms']:.1f} ms, {r['rss_mib']:.1f} MiB"
        print(f"| {n} | {fmt(floor)} | {fmt(ours)} | {fmt(ours_off)} | {fmt(theirs)} | "
              f"1/{theirs['wall_ms'] / ours['wall_ms']:.0f} | 1/{theirs['rss_mib'] / ours['rss_mib']:.0f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
