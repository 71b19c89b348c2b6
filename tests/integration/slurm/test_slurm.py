"""`ddpctl launch --slurm` against a stand-in srun (fake_srun.py), for what the real SLURM of
test_slurm_real.py cannot show: a node whose task fails at once, before its agent runs (an agent
missing or broken on one node: the real cluster's nodes share one file system and one
ddp-agentd); and the parts with no srun at all (SIGUSR1 with --nodes, usage errors).
Everything else of --slurm (contract, srun's flags, failures, scancel, signals, TLS, time limit)
runs against the real one in test_slurm_real.py.

Everything runs inside namespaces the test made (simcluster.py has the network rule); the
cluster fixture tears down every process and namespace it made.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "multinode"))
import simcluster  # noqa: E402
from ddptest import alive  # noqa: E402
from simcluster import finish, job_file, wait_for_contracts  # noqa: E402
job = job_file  # nproc 1, no extra lines

SKIP = simcluster.netns_unavailable()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

PY = "/usr/bin/python3"

# Prints its contract, then (with "trap") waits for SIGUSR1: the handler writes a file naming
# the rank and host into the shared folder, and the worker ends 0. SIGUSR2 is trapped the same
# way ("trap2"). "sleep" just sleeps.
WORKER = r'''
import json, os, signal, socket, sys, time
mode, out_dir = sys.argv[1], sys.argv[2]
got = []
def on_signal(sig, frame):
    name = signal.Signals(sig).name
    with open(os.path.join(out_dir, f"{name}-rank{os.environ['RANK']}"), "w") as f:
        f.write(socket.gethostname())
    got.append(name)
signal.signal(signal.SIGUSR1, on_signal)
signal.signal(signal.SIGUSR2, on_signal)
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR",
        "MASTER_PORT", "TORCHELASTIC_RUN_ID", "GLOO_SOCKET_IFNAME", "DDP_NODE", "DDP_AGENT_SECRET", "SLURM_JOB_ID"]
env = {k: os.environ.get(k) for k in keys}
env["hostname"] = socket.gethostname()
env["pid"] = os.getpid()
print("CONTRACT " + json.dumps(env), flush=True)
deadline = time.time() + 120
if mode == "trap":
    while "SIGUSR1" not in got and time.time() < deadline:
        time.sleep(0.05)
elif mode == "trap-then-sleep":
    while time.time() < deadline:
        time.sleep(0.05)
'''


@pytest.fixture
def cluster():
    with simcluster.Cluster(nodes=3) as c:
        yield c


class Slurm:
    """The stand-in srun and the allocation's environment for one cluster."""

    def __init__(self, c, hosts=None):
        self.c = c
        self.hosts = hosts or c.hosts
        d = os.path.join(c.dir, "slurmbin")
        os.makedirs(d)
        self.srun = os.path.join(d, "srun")
        shutil.copy2(os.path.join(os.path.dirname(__file__), "fake_srun.py"), self.srun)
        os.chmod(self.srun, 0o755)
        prefixes = {h.name: h.wrap([]) for h in c.hosts}
        self.hosts_file = os.path.join(c.dir, "srun-hosts.json")
        with open(self.hosts_file, "w") as f:
            json.dump(prefixes, f)

    def env(self, **extra):
        e = dict(os.environ)
        e.update({
            "PATH": os.path.dirname(self.srun) + ":" + e.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NODELIST": "n[1-%d]" % len(self.hosts),
            "SLURM_JOB_NUM_NODES": str(len(self.hosts)),
            "FAKE_SRUN_HOSTS": self.hosts_file,
            # the agents' per-user state (logs) on each host's private /tmp, not in the real /root
            "XDG_STATE_HOME": "/tmp/state",
        })
        e.update(extra)
        return e

    def launch(self, job_file, *args, **env):
        argv = [os.path.join(self.c.bin, "ddpctl"), "launch", "--slurm", *args, job_file]
        return self.c.ctl.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=self.c.dir,
                                env=self.env(**env))


def assert_nothing_left(c, timeout=20):
    """No process at all in any node's namespace (agents, shepherds, workers) within timeout."""
    deadline = time.time() + timeout
    while time.time() < deadline and any(h.ns_pids() for h in c.hosts):
        time.sleep(0.1)
    left = {h.name: [open(f"/proc/{pid}/cmdline").read().replace("\0", " ") for pid in h.ns_pids() if alive(pid)]
            for h in c.hosts}
    assert not any(left.values()), f"still running: {left}"


def signal_files(c):
    return {name: open(os.path.join(c.dir, "signals", name)).read()
            for name in os.listdir(os.path.join(c.dir, "signals"))}


def test_sigusr1_reaches_every_rank_with_nodes_too(cluster):
    c = cluster
    hosts = c.hosts[:2]
    for h in hosts:
        c.start_agent(h)
    os.makedirs(os.path.join(c.dir, "signals"))
    worker = c.write("worker.py", WORKER)
    p = c.launch(job(c, "usrnodes", [PY, worker, "trap", os.path.join(c.dir, "signals")], nproc=2), hosts=hosts)
    wait_for_contracts(p, 4)
    os.kill(p.pid, signal.SIGUSR1)
    rc, out, err = finish(p, timeout=60)
    assert rc == 0, err  # each worker ends 0 once it got the signal
    assert signal_files(c) == {f"SIGUSR1-rank{r}": hosts[r // 2].name for r in range(4)}


def test_a_node_whose_task_fails_stops_the_launch_and_leaves_nothing(cluster):
    c = cluster
    s = Slurm(c)
    worker = c.write("worker.py", WORKER)
    p = s.launch(job(c, "failnode", [PY, worker, "once", c.dir]), FAKE_SRUN_FAIL_NODE="n2")
    rc, out, err = finish(p, timeout=60)
    assert rc == 2, err
    assert "CONTRACT" not in out
    # srun's own line and the node named by the launch's error
    assert "n2: task 1: Exited with exit code 3" in err, err
    # srun's --kill-on-bad-exit ends the other agents, maybe before they announced themselves,
    # maybe after one announced and dialled in but before it joined, maybe while the coordinator
    # dialled it (a race the launch cannot order: each way, its error names what it saw).
    m = re.search(r"srun ended \(exit status \d+\) before the agents? on (\S+) announced", err)
    early = re.search(r"error \[coord\] (n[13]) \(srun task \d\): the agent ended before joining", err)
    # or srun ended an agent while the coordinator was dialling it
    dialled = re.search(
        r"error \[coord\] (n[13]): cannot reach its agent on port \d+: Connection (reset by peer|refused)", err)
    assert (m and m[1] in ("n2", "n[2-3]", "n[1-2]", "n[1-3]")) or early or dialled, err
    assert_nothing_left(c)


def test_usage_errors():
    bin_ = os.path.join(simcluster.BIN, "ddpctl")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    job_file = os.path.join(simcluster.SRC, "configs", "train_ddp.yaml")
    r = subprocess.run([bin_, "launch", "--slurm", job_file], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 2 and "not inside a SLURM allocation" in r.stderr, r.stderr
    env["SLURM_JOB_NODELIST"] = "n[1-2]"
    for extra, msg in ((["--nodes", "a,b"], "drop --nodes"), (["--ssh"], "pick one"),
                       (["--token-file", "/nonexistent"], "each run makes its own secret")):
        r = subprocess.run([bin_, "launch", "--slurm", *extra, job_file], capture_output=True, text=True, env=env,
                           timeout=30)
        assert r.returncode == 2 and msg in r.stderr, (extra, r.stderr)
    r = subprocess.run([bin_, "launch", "--srun-arg=--x", job_file], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 2 and "--srun-arg needs --slurm" in r.stderr, r.stderr
    # No srun on PATH: said at once, nothing started.
    env["PATH"] = "/nonexistent"
    r = subprocess.run([bin_, "launch", "--slurm", job_file], capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 2 and "cannot start the agents' job step" in r.stderr, r.stderr
