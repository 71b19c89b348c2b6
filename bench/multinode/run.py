#!/usr/bin/env python3
"""Multi-node launch and failure propagation: ddpctl against torchrun, side by side in one run,
on simulated hosts (network namespaces, tests/integration/multinode/simcluster.py; needs root).

  1. launch: 2 nodes x 2 `/bin/true` workers, from the command to the job's end. ddpctl: its
     agents already run (the daemon mode); torchrun: one per node with the c10d rendezvous on
     node 1 (`--rdzv-backend c10d`), Debian's 1.13 (`--redirects 1 --tee 1` for Python 3.11,
     `--monitor-interval 0.1`, its fastest setting).
  2. failure propagation: 3 nodes x 2 workers that sleep (and honour SIGTERM); rank 5 (on node 3)
     exits 3 after 2 s. Measured: from that exit to the moment no worker of the job is left on
     any node (polled from /proc by pid), capped at --cap seconds.

    sudo python3 bench/multinode/run.py [--build build] [--repeats 3] [--cap 30]
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration", "multinode"))
PY = "/usr/bin/python3"

SLEEPER = r'''#!/bin/sh
echo $$ > "$1/pid-$RANK"
if [ "$RANK" = 5 ]; then
  sleep 2
  date +%s.%N > "$1/failed-at"
  exit 3
fi
exec sleep 600
'''


def torchrun_argv(c, host, nnodes, node_rank, script_args, run_id):
    master = c.hosts[0].addr
    return [PY, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--nproc_per_node", "2",
            "--rdzv_backend", "c10d", "--rdzv_endpoint", f"{master}:29400", "--rdzv_id", run_id,
            "--node_rank", str(node_rank), "--monitor_interval", "0.1", "--redirects", "1", "--tee", "1",
            "--max_restarts", "0", "--no_python", *script_args]


def all_gone(pids):
    return not any(os.path.exists(f"/proc/{p}") for p in pids)


def launch_once(c, which, job, out):
    t0 = time.time()
    if which == "ddpctl":
        p = c.launch(job, "-q")
        p.communicate(timeout=120)
        ok = p.returncode == 0
    else:
        run_id = f"b{time.time_ns()}"
        procs = [h.popen(torchrun_argv(c, h, 2, i, ["/bin/true"], run_id), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL) for i, h in enumerate(c.hosts[:2])]
        ok = all(p.wait(timeout=120) == 0 for p in procs)
    if not ok:
        sys.exit(f"{which} launch failed")
    return time.time() - t0


def propagation_once(c, which, job, cap, run):
    d = os.path.join(c.dir, f"run-{run}")
    os.makedirs(d)
    os.chmod(d, 0o777)
    script = c.write("sleeper.sh", SLEEPER)
    if which == "ddpctl":
        job_file = c.write(f"fail-{run}.yaml", f"name: fail\nnproc_per_node: 2\ncommand: [{script}, {d}]\n"
                                               "store: {port: 29500}\nstop: {grace: 5s}\n")
        launchers = [c.launch(job_file, "-q")]
    else:
        run_id = f"f{time.time_ns()}"
        launchers = [h.popen(torchrun_argv(c, h, 3, i, [script, d], run_id), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL) for i, h in enumerate(c.hosts)]
    deadline = time.time() + 60
    def failed_at():
        try:
            return float(open(os.path.join(d, "failed-at")).read())
        except (OSError, ValueError):
            return None
    while time.time() < deadline and not (failed_at() and len([f for f in os.listdir(d) if f.startswith("pid-")]) == 6):
        time.sleep(0.01)
    if not failed_at():
        sys.exit(f"{which}: rank 5 did not fail within 60 s")
    pids = [int(open(os.path.join(d, f)).read()) for f in os.listdir(d) if f.startswith("pid-")]
    t_fail = failed_at()
    while not all_gone(pids) and time.time() - t_fail < cap:
        time.sleep(0.005)
    took = time.time() - t_fail
    for p in launchers:  # whatever is left: stopped by the pids we started (their process groups)
        if p.poll() is None:
            try:
                os.killpg(p.pid, 9)
            except ProcessLookupError:
                pass
        p.wait(timeout=30)
    for pid in pids:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    return took, all_gone(pids)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cap", type=float, default=30.0)
    args = ap.parse_args()
    os.environ["DDP_BINARY_DIR"] = os.path.abspath(args.build)
    # The system's PATH for the agents and the launcher, whose PATH the job's environment carries:
    # ddpctl asks the job's python3 on each node for its PyTorch before the join, and that should
    # be the machine's python3, which torchrun's side runs, not whatever the shell running this
    # benchmark finds first (a pyenv Python that imports certifi at start-up, 5x slower here).
    os.environ["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    import simcluster  # noqa: E402 (reads DDP_BINARY_DIR)
    why = simcluster.netns_unavailable()
    if why:
        sys.exit(why)
    with simcluster.Cluster(nodes=3) as c:
        os.environ["XDG_STATE_HOME"] = os.path.join(c.dir, "state")  # the ended jobs' records go with the run
        for h in c.hosts:
            c.start_agent(h)
        job = c.write("true.yaml", "name: true\nnproc_per_node: 2\ncommand: [/bin/true]\nstore: {port: 29500}\n")
        two = c.write("true2.yaml", "name: true\nnproc_per_node: 2\ncommand: [/bin/true]\nstore: {port: 29500}\n")
        ours = [launch_once(_TwoNodes(c), "ddpctl", two, None) for _ in range(args.repeats)]
        theirs = [launch_once(c, "torchrun", job, None) for _ in range(args.repeats)]
        a, b = statistics.median(ours), statistics.median(theirs)
        print("| 2 nodes x 2 /bin/true | ddpctl | torchrun | ddpctl / torchrun |")
        print("|---|---|---|---|")
        print(f"| launch to end (median of {args.repeats}) | {a * 1000:.0f} ms | {b * 1000:.0f} ms | 1/{b / a:.0f} |")
        ours = [propagation_once(c, "ddpctl", job, args.cap, f"d{i}") for i in range(args.repeats)]
        theirs = [propagation_once(c, "torchrun", job, args.cap, f"t{i}") for i in range(args.repeats)]

        def show(runs):
            gone = all(g for _, g in runs)
            t = statistics.median(t for t, _ in runs)
            return (f"{t * 1000:.0f} ms" if gone else f"> {args.cap:.0f} s (workers still running)"), t, gone
        sa, ta, ga = show(ours)
        sb, tb, gb = show(theirs)
        ratio = f"1/{tb / ta:.0f}" if ga and gb else ("ddpctl only" if ga else "n/a")
        print(f"| failure on node 3 to no worker left, 3 nodes x 2 (median of {args.repeats}) | {sa} | {sb} | {ratio} |")


class _TwoNodes:
    """The cluster seen with its first two hosts only (ddpctl's --nodes)."""

    def __init__(self, c):
        self.c = c

    def launch(self, job, *args):
        return self.c.launch(job, *args, hosts=self.c.hosts[:2])


if __name__ == "__main__":
    main()
