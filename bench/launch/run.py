#!/usr/bin/python3
"""Launch overhead: ddpctl against torchrun, side by side in one run, as ratios.

N trivial workers (/bin/true, N = 1, 4, 16) started by
  - the floor: a shell forking them all at once, `sh -c '/bin/true & ... wait'`,
  - the floor with an NCCL id (libnccl being present): the same shell, once `nccl_id_floor` (a
    small C program: load libnccl, ncclGetUniqueId, print the id) has made the id its workers
    would need; what NCCL itself costs before any launcher can start a worker,
  - ddpctl launch (store served, NCCL id made when libnccl is present: `nccl.unique_id: auto`),
  - ddpctl launch with nccl.unique_id: off,
  - with --compare, another ddpctl (an older build) the same two ways, run alternately with the
    first so that both see the same machine,
  - Debian's torchrun 1.13 (`--standalone --no_python`; Python 3.11 needs `--redirects 1 --tee 1`
    to avoid its Std.from_str crash, and we pass `--monitor_interval 0.1`, its fastest setting;
    the default 5 s poll would make it look far worse).
Then `ddpctl --version` alone (the cost of starting the binary: loader, libraries, allocator).

Per case: wall time, median of R runs and its spread (the middle half, 25th to 75th percentile),
from the fork of the launcher to its reaping (`timed_run`, a small C program beside ddpctl);
peak RSS, the largest resident set in the launcher's process tree as wait4 reports it (as GNU
time's %M; for /bin/true workers the launcher itself); minor page faults, the median over the
runs, summed over the whole tree (the launcher, the NCCL id holder and the workers: each
/bin/true takes about 60-70). On a
paravirtualised VM a page fault costs about 15 us, so faults are most of a start's time.

Usage: bench/launch/run.py [--repeats R] [--ddpctl build/bin/ddpctl] [--compare OTHER/ddpctl]
                           [--id-floor build/bin/nccl_id_floor] [--sizes 1,4,16] [--no-torchrun]
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


TIMED_RUN = None  # bench/launch/timed_run, set in main()


def measure(argv, cwd, env=None):
    # timed_run (a small C program) forks the launcher and reaps it, timing just that: so a
    # run's wall time holds neither its own start nor Python's fork (a constant that made each
    # ratio to the floor look smaller), and its peak RSS is the launcher's own; a fork from this
    # Python process would carry Python's RSS into the child's high-water mark.
    out = Path(cwd) / "time.out"
    rc = subprocess.call([str(TIMED_RUN), str(out), *argv], cwd=cwd, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if rc != 0:
        raise SystemExit(f"{argv[0]} failed with {rc}: {' '.join(argv)}")
    wall_ns, rss_kib, faults = out.read_text().split()
    return int(wall_ns) / 1e9, int(rss_kib) / 1024.0, int(faults)


class Case:
    def __init__(self, label, argv, env=None):
        self.label, self.argv, self.env = label, argv, env
        self.walls, self.rss, self.faults = [], [], []

    def once(self, cwd):
        w, r, f = measure(self.argv, cwd, self.env)
        self.walls.append(w * 1000)
        self.rss.append(r)
        self.faults.append(f)

    def wall(self):
        return statistics.median(self.walls)

    def spread(self):
        if len(self.walls) < 4:
            return min(self.walls), max(self.walls)
        q = statistics.quantiles(self.walls, n=4)
        return q[0], q[2]

    def cell(self):
        lo, hi = self.spread()
        return (f"{self.wall():.1f} ms ({lo:.1f}–{hi:.1f}), {max(self.rss):.1f} MiB, "
                f"{statistics.median(self.faults):.0f} flt")


def run_alternately(cases, cwd, repeats):
    """Each case once to warm the page cache, then R rounds of every case in turn: a burst of load
    on the machine falls on all of them alike."""
    for c in cases:
        measure(c.argv, cwd, c.env)
    for _ in range(repeats):
        for c in cases:
            c.once(cwd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--torchrun-repeats", type=int, default=3)
    ap.add_argument("--ddpctl", default=str(ROOT / "build" / "bin" / "ddpctl"))
    ap.add_argument("--compare", help="another ddpctl (ddp-ncclid beside it), e.g. an older commit's build")
    ap.add_argument("--sizes", default="1,4,16")
    ap.add_argument("--no-torchrun", action="store_true")
    ap.add_argument("--python", default="/usr/bin/python3", help="the interpreter whose torchrun is measured")
    ap.add_argument("--id-floor", help="nccl_id_floor (default: beside --ddpctl)")
    ap.add_argument("--timed-run", help="timed_run, the stopwatch (default: beside --ddpctl)")
    args = ap.parse_args()
    global TIMED_RUN
    TIMED_RUN = Path(args.timed_run) if args.timed_run else Path(args.ddpctl).parent / "timed_run"
    if not TIMED_RUN.exists():
        raise SystemExit(f"{TIMED_RUN} not found: build it (./scripts/build), or name it with --timed-run")
    id_floor = Path(args.id_floor) if args.id_floor else Path(args.ddpctl).parent / "nccl_id_floor"
    # The floor with an id only where libnccl loads (as ddpctl's `unique_id: auto` makes one only there).
    has_nccl = id_floor.exists() and subprocess.call([str(id_floor)], stdout=subprocess.DEVNULL,
                                                     stderr=subprocess.DEVNULL) == 0

    tmp = Path(tempfile.mkdtemp(prefix="ddp-bench-"))
    # XDG_STATE_HOME: the ended jobs' records stay with the run's files, not in the user's state folder.
    env = dict(os.environ, DDP_LOG_LEVEL="warn", XDG_STATE_HOME=str(tmp / "state"))
    builds = [("ddpctl", args.ddpctl)] + ([("compared", args.compare)] if args.compare else [])
    print(f"# launch of N /bin/true workers; median of {args.repeats} (torchrun: {args.torchrun_repeats}) runs, "
          f"(25th–75th percentile), peak RSS, minor page faults of the whole tree")
    print(f"# machine: {os.cpu_count()} CPUs, {os.uname().release}; load before: {os.getloadavg()[0]:.2f}")
    for name, path in builds:
        print(f"# {name}: {path}")
    print()
    head = ["N", "floor (sh fork+exec)"] + (["floor with an NCCL id"] if has_nccl else [])
    for name, _ in builds:
        head += [name, f"{name}, no NCCL id"]
    if not args.no_torchrun:
        head += ["torchrun"]
    head += ["ddpctl / floor"] + (["ddpctl / floor with id"] if has_nccl else [])
    if not args.no_torchrun:
        head += ["ddpctl / torchrun (wall)"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for n in (int(s) for s in args.sizes.split(",")):
        for nccl in ("auto", "off"):
            (tmp / f"job-{n}-{nccl}.yaml").write_text(
                f"nproc_per_node: {n}\ncommand: [/bin/true]\nlogs: {{dir: {tmp}/logs}}\nnccl: {{unique_id: {nccl}}}\n")
        forks = " ".join(["/bin/true &"] * n) + " wait"
        cases = [Case("floor", ["/bin/sh", "-c", forks])]
        if has_nccl:
            # The id in the workers' environment, as ddpctl puts it there (DDP_NCCL_UNIQUE_ID).
            cases.append(Case("floor with id", ["/bin/sh", "-c", f"DDP_NCCL_UNIQUE_ID=$({id_floor}) || exit 3; "
                                                               f"export DDP_NCCL_UNIQUE_ID; {forks}"]))
        floors = len(cases)
        for name, path in builds:
            for nccl in ("auto", "off"):
                cases.append(Case(name, [path, "launch", "-q", "--master-port", "0", f"job-{n}-{nccl}.yaml"], env))
        run_alternately(cases, tmp, args.repeats)
        row = [str(n)] + [c.cell() for c in cases]
        ours = cases[floors]
        ratios = [f"{ours.wall() / cases[0].wall():.2f}×"]
        if has_nccl:
            ratios.append(f"{ours.wall() / cases[1].wall():.2f}×")
        if not args.no_torchrun:
            theirs = Case("torchrun", [args.python, "-m", "torch.distributed.run", "--standalone",
                                       "--nproc_per_node", str(n), "--no_python", "--redirects", "1", "--tee", "1",
                                       "--monitor_interval", "0.1", "--log_dir", str(tmp / "tr"), "/bin/true"])
            run_alternately([theirs], tmp, args.torchrun_repeats)
            row += [theirs.cell()] + ratios + [f"1/{theirs.wall() / ours.wall():.0f}"]
        else:
            row += ratios
        print("| " + " | ".join(row) + " |")
        sys.stdout.flush()

    print()
    print("| `--version` alone | " + " | ".join(name for name, _ in builds) + " |")
    print("|---|" + "---|" * len(builds))
    versions = [Case(name, [path, "--version"], env) for name, path in builds]
    run_alternately(versions, tmp, args.repeats)
    print("| wall, RSS, faults | " + " | ".join(c.cell() for c in versions) + " |")


if __name__ == "__main__":
    main()
