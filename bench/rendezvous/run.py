#!/usr/bin/env python3
"""Rendezvous at scale: N agents speaking the real protocol over loopback (fake_agents, one
process) join one coordinator (`ddpctl launch --nodes`); reported per N: time from the first
connection to the last `assign` (the rendezvous), to the last node's start (every node has its
orders: under protocol version 4 a node's assign is also its start), and the whole launch (dial,
handshakes, clock probes, rendezvous, start, the workers' run, every node's result) as ddpctl's
wall time, and the CPU time (user + system) each side spent on the whole launch: on this
benchmark both share the machine's cores, so what one side saves the other can use.

    python3 bench/rendezvous/run.py [--build build] [--compare OTHER_BUILD] [--sizes 64,512,4096] [--repeats 3]
                                    [--work-ms 250] [--agents FAKE_AGENTS] [--steady SECONDS]
                                    [--heartbeat-timeout 6] [--agent-timeout 6] [--heartbeat-ms MS] [--own-agents]
                                    [--floor]

Also reported: each side's CPU split into user and system time (the system time is mostly the
kernel's loopback TCP: both ends' stacks run in the sending process), and the TCP segments the
machine sent during the launch per node (/proc/net/snmp OutSegs, machine-wide: other traffic on
the machine counts too). With --steady S, the workers run S + 2 s and, from 1 s after the last
node started, ddpctl's and fake_agents' CPU over S seconds is measured: the heartbeats' cost.
The agents beat as real ones do: every second to a coordinator of protocol version 6 or older;
to one of version 7, at its offer (a third of the job's --heartbeat-timeout, default 6 s) or a
third of their own --agent-timeout (default 6 s), whichever is shorter; ddpctl answers each beat.
--heartbeat-ms fixes the agents' interval instead.

With --floor, each repeat also runs bench/rendezvous/loopback_floor (the --build's): the same
traffic over raw loopback sockets with no protocol work, the kernel's own cost on this machine
at this sitting; reported beside ddpctl's figures with their ratio. With --steady, its heartbeat
mode runs too, for S seconds at the interval the --build's agents beat at (as fake_agents reports
it), the coordinator answering each beat; a --compare build of an older protocol beats every
second, so its heartbeat ratio is not like for like.

Everything stays on 127.0.0.1. Each agent "runs" one worker that exits 0 after --work-ms (see
fake_agents.cpp for why not at once); the whole launch includes that time. With --compare both
builds face the same fake_agents (--agents, default the --build's), so only the coordinator
differs; with --own-agents each build faces its own (for a change to code both sides run, such as
lib/proto).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_base(count):
    """A run of `count` ports that nothing listens on (from /proc/net/tcp), below the ephemeral range."""
    busy = set()
    for f in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            for line in open(f).readlines()[1:]:
                busy.add(int(line.split()[1].rsplit(":", 1)[1], 16))
        except OSError:
            pass
    base = 20000
    while any(p in busy for p in range(base, base + count)):
        base += count
    if base + count > 32000:
        sys.exit("no free run of ports below 32000")
    return base


def reap(proc, timeout, what):
    """wait4 on `proc` with a deadline (killed and the run abandoned past it): (status, rusage)."""
    deadline = time.time() + timeout
    while True:
        pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return status, ru
        if time.time() > deadline:
            proc.kill()
            proc.wait()
            sys.exit(f"{what} did not end within {timeout} s")
        time.sleep(0.005)


def tcp_out_segs():
    lines = [l.split() for l in open("/proc/net/snmp") if l.startswith("Tcp:")]
    return int(lines[1][lines[0].index("OutSegs")])


def proc_cpu(pid):
    """utime + stime of a live process, seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def floor_run(binary, n, steady=0, interval_ms=0):
    """One loopback_floor run: its `key value` pairs (rendezvous; or heartbeat when steady)."""
    argv = [binary, "--count", str(n)]
    if steady:
        argv += ["--mode", "heartbeat", "--seconds", str(steady), "--reply", "--interval-ms", str(interval_ms)]
    if not os.access(binary, os.X_OK):
        sys.exit(f"--floor: {binary} is missing (./scripts/build builds it)")
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120 + steady)
    except subprocess.TimeoutExpired:
        sys.exit(f"loopback_floor did not end within {120 + steady} s: {' '.join(argv)}")
    if out.returncode != 0:
        sys.exit(f"loopback_floor failed: {out.stderr.strip()[-500:]}")
    words = out.stdout.split()
    return {k: v for k, v in zip(words[::2], words[1::2])}


def one(build, agents_bin, work_ms, n, tmp, steady=0, beats=()):
    token = os.path.join(tmp, "token")
    base = free_base(n)
    out = os.path.join(tmp, f"agents-{n}.json")
    agents = subprocess.Popen([agents_bin, "--count", str(n), "--base-port", str(base), "--token-file", token, "--out", out,
                               "--work-ms", str(work_ms), *beats], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "DDP_LOG_LEVEL": "warn"})
    try:
        if agents.stdout.readline().strip() != "ready":
            sys.exit("fake_agents did not start")
        nodes = ",".join(f"127.0.0.1:{base + i}" for i in range(n))
        job = os.path.join(tmp, "job.yaml")
        segs0 = tcp_out_segs()
        t0 = time.time()
        idle = None
        with tempfile.TemporaryFile(mode="w+") as err:
            ctl = subprocess.Popen([os.path.join(build, "bin", "ddpctl"), "launch", "-q", "--nodes", nodes, "--token-file",
                                    token, "--log-dir", os.path.join(tmp, "logs"), job], stdout=subprocess.DEVNULL, stderr=err)
            if steady:
                # The steady state: every node started, the workers "running", only heartbeats.
                if agents.stdout.readline().strip() != "started":
                    sys.exit("fake_agents did not report every node started")
                time.sleep(1)
                c0, a0, w0 = proc_cpu(ctl.pid), proc_cpu(agents.pid), time.time()
                time.sleep(steady)
                c1, a1, w1 = proc_cpu(ctl.pid), proc_cpu(agents.pid), time.time()
                idle = ((c1 - c0) / (w1 - w0), (a1 - a0) / (w1 - w0))
            # wait4: the exit status and the process's CPU time (user + system) in one call.
            status, ru = reap(ctl, 300, "ddpctl")
            wall = time.time() - t0
            segs = tcp_out_segs() - segs0
            ctl_cpu = ru.ru_utime + ru.ru_stime
            ctl_sys = ru.ru_stime
            if os.waitstatus_to_exitcode(status) != 0:
                err.seek(0)
                sys.exit(f"ddpctl failed with {os.waitstatus_to_exitcode(status)}:\n{err.read()[-3000:]}")
        _, ru = reap(agents, 60, "fake_agents")
        agents_cpu = ru.ru_utime + ru.ru_stime
        agents_sys = ru.ru_stime
    finally:
        if agents.returncode is None and agents.poll() is None:
            agents.kill()
            agents.wait()
    got = json.load(open(out))
    if got["assigned"] != n or got["finished"] != n:
        sys.exit(f"only {got['assigned']} of {n} agents were assigned, {got['finished']} finished")
    agents_cpu -= got.get("setup_cpu_us", 0) / 1e6  # the listeners it opened before "ready"
    start = (got["last_start_us"] - got["first_accept_us"]) / 1e6 if "last_start_us" in got else None
    return ((got["last_assign_us"] - got["first_accept_us"]) / 1e6, start, wall, ctl_cpu, agents_cpu, ctl_sys, agents_sys,
            segs / n, idle, int(statistics.median(got["beat_ms"])) if got.get("beat_ms") else 0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--sizes", default="64,512,4096")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--compare", help="another build folder (e.g. an older commit's), run alternately with --build")
    ap.add_argument("--work-ms", type=int, default=250, help="how long each fake worker runs")
    ap.add_argument("--agents", help="the fake_agents binary (default: the --build's)")
    ap.add_argument("--own-agents", action="store_true",
                    help="with --compare, each build faces its own bin/fake_agents (a change to the protocol's "
                         "code is on both sides)")
    ap.add_argument("--steady", type=float, default=0,
                    help="measure the heartbeats' CPU over this many seconds once every node runs")
    ap.add_argument("--heartbeat-ms", type=int,
                    help="fix the fake agents' heartbeat interval (0: none; default: as real agents, from the offer)")
    ap.add_argument("--heartbeat-timeout", type=float, default=6,
                    help="the job's rendezvous.heartbeat_timeout in seconds (version 7 agents beat at a third of it)")
    ap.add_argument("--agent-timeout", type=float, default=6,
                    help="the fake agents' own heartbeat_timeout in seconds (they beat at a third of it at most)")
    ap.add_argument("--floor", action="store_true",
                    help="also run loopback_floor each repeat (the kernel's loopback TCP alone) and give the ratios")
    args = ap.parse_args()
    if args.own_agents and args.agents:
        ap.error("--own-agents and --agents name two different fake_agents: give one")
    agents_bin = args.agents or os.path.join(args.build, "bin", "fake_agents")
    builds = [args.build] + ([args.compare] if args.compare else [])
    with tempfile.TemporaryDirectory(prefix="ddp-rdzv-bench-") as tmp:
        os.environ["XDG_STATE_HOME"] = os.path.join(tmp, "state")  # the ended jobs' records go with the run
        fd = os.open(os.path.join(tmp, "token"), os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, (os.urandom(32).hex() + "\n").encode())
        os.close(fd)
        with open(os.path.join(tmp, "job.yaml"), "w") as f:
            f.write("name: rdzv-bench\nnproc_per_node: 1\ncommand: [/bin/true]\nstore: {port: 29500}\n"
                    f"rendezvous: {{heartbeat_timeout: {int(args.heartbeat_timeout * 1000)}ms}}\n")
        beats = ["--agent-timeout-ms", str(int(args.agent_timeout * 1000))]
        if args.heartbeat_ms is not None:
            beats += ["--heartbeat-ms", str(args.heartbeat_ms)]
        print(f"{'build':<24} {'nodes':>6} {'rendezvous (median)':>20} {'last start (median)':>20} "
              f"{'whole launch (median)':>22} {'CPU: ddpctl / agents':>21}   runs (rendezvous/whole, ms)")
        for n in (int(x) for x in args.sizes.split(",")):
            # Alternately, so that both builds see the same machine (load, TIME_WAIT sockets).
            runs = {b: [] for b in builds}
            floors, beat_floors = [], []
            floor_bin = os.path.join(args.build, "bin", "loopback_floor")
            interval = 0
            for _ in range(args.repeats):
                for b in builds:
                    work_ms = int((args.steady + 2) * 1000) if args.steady else args.work_ms
                    agents = os.path.join(b, "bin", "fake_agents") if args.own_agents else agents_bin
                    runs[b].append(one(b, agents, work_ms, n, tmp, args.steady, beats))
                if args.floor:
                    floors.append(floor_run(floor_bin, n))
                    # At the interval the --build's agents beat at in this repeat (fake_agents reports
                    # it: proto/heartbeat's rule, or --heartbeat-ms).
                    interval = runs[args.build][-1][9]
                    if args.steady and interval > 0:
                        beat_floors.append(floor_run(floor_bin, n, args.steady, interval))
            for b in builds:
                rdzv = statistics.median(r[0] for r in runs[b])
                starts = [r[1] for r in runs[b] if r[1] is not None]
                start = f"{statistics.median(starts) * 1000:>17.1f} ms" if starts else f"{'-':>20}"
                wall = statistics.median(r[2] for r in runs[b])
                cpu = f"{statistics.median(r[3] for r in runs[b]) * 1000:.0f} / {statistics.median(r[4] for r in runs[b]) * 1000:.0f} ms"
                print(f"{os.path.relpath(b, ROOT)[-24:]:<24} {n:>6} {rdzv * 1000:>17.1f} ms {start} {wall * 1000:>19.1f} ms "
                      f"{cpu:>21}   " + ", ".join(f"{r[0] * 1000:.0f}/{r[2] * 1000:.0f}" for r in runs[b]), flush=True)
                med = lambda i: statistics.median(r[i] for r in runs[b])
                print(f"{'':<24} {'':>6} of which system time: ddpctl {med(5) * 1000:.0f} ms, agents {med(6) * 1000:.0f} ms; "
                      f"TCP segments sent per node: {med(7):.1f}; CPU per node, both sides: "
                      f"{(med(3) + med(4)) / n * 1e6:.0f} us", flush=True)
                if args.steady:
                    print(f"{'':<24} {'':>6} steady state (heartbeats only), share of one core: ddpctl "
                          f"{statistics.median(r[8][0] for r in runs[b]) * 100:.2f}%, agents "
                          f"{statistics.median(r[8][1] for r in runs[b]) * 100:.2f}% "
                          f"(runs: " + ", ".join(f"{r[8][0] * 100:.2f}" for r in runs[b]) + ")", flush=True)
                fwall = statistics.median(float(f["wall_ms"]) for f in floors) if floors else 0
                if fwall > 0:
                    # Wall time only: the CPU above is the whole launch's, the floor's the rendezvous' alone.
                    print(f"{'':<24} {'':>6} rendezvous against the kernel's floor (loopback_floor, alternating): "
                          f"{rdzv * 1000 / fwall:.2f}x", flush=True)
                fbeat = statistics.median(float(f["coordinator_core_pct"]) for f in beat_floors) if beat_floors else 0
                if fbeat > 0:
                    print(f"{'':<24} {'':>6} heartbeats against the floor's coordinator: "
                          f"{statistics.median(r[8][0] for r in runs[b]) * 100 / fbeat:.2f}x", flush=True)
            if floors:
                print(f"{'loopback_floor':<24} {n:>6} {statistics.median(float(f['wall_ms']) for f in floors):>17.1f} ms "
                      f"{'-':>20} {'-':>22} "
                      f"{statistics.median(float(f['coordinator_user_ms']) + float(f['coordinator_sys_ms']) for f in floors):>9.0f}"
                      f" / {statistics.median(float(f['agents_user_ms']) + float(f['agents_sys_ms']) for f in floors):.0f} ms   "
                      + ", ".join(f"{float(f['wall_ms']):.0f}" for f in floors), flush=True)
                print(f"{'':<24} {'':>6} TCP segments sent per node: "
                      f"{statistics.median(float(f['segments_per_node']) for f in floors):.1f}; CPU per node, both sides: "
                      f"{statistics.median(float(f['cpu_us_per_node']) for f in floors):.0f} us (the rendezvous' frames "
                      f"only: no worker reports, no close)", flush=True)
            if beat_floors:
                print(f"{'':<24} {'':>6} steady state, beats every {interval} ms each way, share of one core: "
                      f"coordinator {statistics.median(float(f['coordinator_core_pct']) for f in beat_floors):.2f}%, "
                      f"agents {statistics.median(float(f['agents_core_pct']) for f in beat_floors):.2f}% (runs: "
                      + ", ".join(f"{float(f['coordinator_core_pct']):.2f}" for f in beat_floors) + ")", flush=True)


if __name__ == "__main__":
    main()
