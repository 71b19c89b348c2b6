"""`ddpctl launch --slurm` under a real SLURM (Debian 12's slurm-wlm 22.05, munge) on simulated
hosts: slurmctld on 'ctl', one slurmd on each of n1..n3 (partition main) and n4 (partition
limit, the time-limit test's node), started by slurmcluster.py with a munge key made here and
all of SLURM's state in the run's folder. One cluster serves the whole file (module fixture);
each test leaves its nodes as it found them (nothing but slurmd, every node idle).

Real sbatch, salloc, srun and scancel around ddpctl, each test checking what a user would: the
contract as the ranks see it (sbatch and salloc), the srun line ddpctl builds (lib/slurm)
accepted by the real srun, a failing rank failing the batch job with ddpctl's exit status,
scancel leaving nothing on any node, `scancel --signal=USR1 --batch` reaching every rank
through ddpctl (the README's sbatch example), SIGUSR2 then SIGTERM to the batch shell, --tls on
the wire, an agent killed, ddpctl killed (in the batch step, and in an salloc shell that stays),
a step the real srun refuses, a node's slurmd killed, and a time limit reached.

Time budget: at most 2 minutes for the whole file on 2 cores. The floor is the time limit:
SLURM's smallest is a minute and slurmctld checks limits every 30 s, so that job is submitted
first (by the fixture, on n4) and checked by the last test, while the others run. Measured
(2 shared cores, load average 4 to 9): 93 s twice, 13 tests; the cluster starts in 1.5 to 5 s.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "multinode"))
sys.path.insert(0, os.path.dirname(__file__))
import simcluster  # noqa: E402
import slurmcluster  # noqa: E402
from ddptest import GUARDIAN_COMM, alive, proc_argv, proc_comm  # noqa: E402
from simcluster import captured, contracts, job_file  # noqa: E402

SKIP = slurmcluster.slurm_unavailable()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

PY = "/usr/bin/python3"

# Prints its contract; SIGUSR1, SIGUSR2 and SIGTERM each leave a file "SIG-rankR" holding the host's
# name in the out folder (SIGTERM then ends it 143). Modes: "once" ends at once; "usr1" ends 0
# once SIGUSR1 came; "sleep" sleeps (bounded); "fail" is "sleep" except rank 4, which ends 7.
WORKER = r'''
import json, os, signal, socket, sys, time
mode, out_dir = sys.argv[1], sys.argv[2]
rank = os.environ["RANK"]
got = []
def mark(name):
    with open(os.path.join(out_dir, f"{name}-rank{rank}"), "w") as f:
        f.write(socket.gethostname())
def on_usr1(sig, frame):
    mark("SIGUSR1")
    got.append(sig)
def on_term(sig, frame):
    mark("SIGTERM")
    sys.exit(143)
signal.signal(signal.SIGUSR1, on_usr1)
signal.signal(signal.SIGUSR2, lambda sig, frame: mark("SIGUSR2"))
signal.signal(signal.SIGTERM, on_term)
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR",
        "MASTER_PORT", "TORCHELASTIC_RUN_ID", "GLOO_SOCKET_IFNAME", "DDP_NODE", "DDP_AGENT_SECRET", "SLURM_JOB_ID"]
env = {k: os.environ.get(k) for k in keys}
env["hostname"] = socket.gethostname()
print("CONTRACT " + json.dumps(env), flush=True)
if mode == "fail" and rank == "4":
    sys.exit(7)
deadline = time.time() + 150
while mode != "once" and time.time() < deadline and not (mode == "usr1" and got):
    time.sleep(0.05)
'''


@pytest.fixture(scope="module")
def slurm():
    with simcluster.Cluster(nodes=4) as c:
        with slurmcluster.SlurmCluster(c, partitions={"main": c.hosts[:3], "limit": c.hosts[3:]}) as s:
            s.worker = c.write("worker.py", WORKER)
            # The time-limit job first: it needs a minute, and runs on n4 while the others go on.
            s.limit = Job(s, "limit", "sleep", nodes=1, partition="limit", sbatch=["--time=1"],
                          store="{port: 0}")
            yield s


class Job:
    """One `ddpctl launch --slurm` in an sbatch script (`exec ddpctl ...`, as in the README)."""

    def __init__(self, s, name, mode, nodes=3, partition="main", sbatch=(), store="{port: 29500}", script_args=""):
        c = s.c
        self.s, self.name = s, name
        self.out_dir = os.path.join(c.dir, f"out-{name}")
        os.makedirs(self.out_dir)
        spec = job_file(c, name, [PY, s.worker, mode, self.out_dir], nproc=2, store=store)
        self.result = os.path.join(c.dir, f"{name}.result.json")
        script = c.write(f"{name}.sbatch", "#!/bin/bash\n"
                                           f"exec ddpctl launch --slurm --result-json {self.result} {script_args} {spec}\n")
        self.output = os.path.join(c.dir, f"{name}.out")
        r = s.ctl("sbatch", "--parsable", f"--nodes={nodes}", f"--partition={partition}", f"--job-name={name}",
                  f"--chdir={c.dir}", f"--output={self.output}", *sbatch, script)
        assert r.returncode == 0, r.stdout + r.stderr
        self.id = r.stdout.strip().split(";")[0]
        self.hosts = s.hosts_of(partition)[:nodes]
        self.pids = set()  # every process seen on the job's nodes while it ran

    def text(self):
        try:
            with open(self.output, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def wait_contracts(self, n, timeout=60):
        deadline = time.time() + timeout
        while len(contracts(self.text())) < n and time.time() < deadline:
            time.sleep(0.1)
        got = contracts(self.text())
        for h in self.hosts:
            self.pids.update(h.ns_pids())
        self.cgroups = self.s.agent_cgroups(self.pids)  # the cgroups the job's agents made, while it runs
        assert len(got) == n, f"{len(got)} of {n} ranks started:\n{self.text()}\n{self.s.logs()}"
        return got

    def signals(self):
        return {n: open(os.path.join(self.out_dir, n)).read() for n in os.listdir(self.out_dir)}

    def wait_signals(self, n, timeout=30):
        deadline = time.time() + timeout
        while len(self.signals()) < n and time.time() < deadline:
            time.sleep(0.1)
        return self.signals()

    def info(self, states=("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"), timeout=60):
        return self.s.wait_job_state(self.id, states, timeout=timeout)


def leftovers(s, hosts):
    """{host: [cmdlines]} of processes in hosts' namespaces other than their slurmd."""
    slurmd = {s.daemons[f"slurmd-{h.name}"].pid for h in hosts if f"slurmd-{h.name}" in s.daemons}
    out = {}
    for h in hosts:
        left = []
        for pid in h.ns_pids():
            if pid in slurmd or not alive(pid):
                continue
            try:
                left.append(f"{pid}: " + open(f"/proc/{pid}/cmdline").read().replace("\0", " ").strip())
            except OSError:
                pass
        if left:
            out[h.name] = left
    return out


def assert_nothing_left(s, hosts, pids=(), timeout=30):
    """Nothing but slurmd in any node's namespace (no slurmstepd, agent, shepherd or worker), and
    no process in a cgroup the job's agents made (ddpctl-<pid>-... under the cgroup v2 hierarchy,
    pid one of pids)."""
    deadline = time.time() + timeout
    while leftovers(s, hosts) and time.time() < deadline:
        time.sleep(0.1)
    assert not leftovers(s, hosts), f"still running: {leftovers(s, hosts)}"
    # The cgroup itself may stay, empty, when SLURM ends the step before its shepherd removed it
    # (seen after kill -9 of ddpctl); the next launch on that node sweeps it (supervisor::Cgroup).
    for d in s.agent_cgroups(set(pids)):
        try:
            procs = open(os.path.join(d, "cgroup.procs")).read().split()
        except FileNotFoundError:
            continue  # removed meanwhile
        assert not procs, f"{d} still holds {procs}"
        try:
            os.rmdir(d)  # ours (made by this job's agents) and empty: not left for another run's sweep
        except FileNotFoundError:
            pass


def check_contract(by_rank, hosts, nproc=2):
    assert sorted(by_rank) == list(range(nproc * len(hosts))), by_rank
    for rank, (node, env) in by_rank.items():
        host = hosts[rank // nproc]  # node ranks follow SLURM_JOB_NODELIST's order
        assert node == host.name and env["hostname"] == host.name, (rank, node, env)
        assert env["RANK"] == str(rank) and env["LOCAL_RANK"] == str(rank % nproc)
        assert env["WORLD_SIZE"] == str(nproc * len(hosts)) and env["LOCAL_WORLD_SIZE"] == str(nproc)
        assert env["GROUP_RANK"] == str(rank // nproc) and env["GROUP_WORLD_SIZE"] == str(len(hosts))
        assert env["MASTER_ADDR"] == hosts[0].addr and env["MASTER_PORT"] == "29500"
        assert env["GLOO_SOCKET_IFNAME"] == "eth0"
        # Neither the run's secret nor the allocation's SLURM_* variables reach a worker.
        assert env["DDP_AGENT_SECRET"] is None and env["SLURM_JOB_ID"] is None, env


def test_sbatch_runs_the_contract_on_three_nodes(slurm):
    s = slurm
    job = Job(s, "contract", "once")
    info = job.info()
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, job.text())
    check_contract(contracts(job.text()), job.hosts)
    assert json.load(open(job.result))["status"] == "succeeded"
    assert_nothing_left(s, job.hosts)


def test_salloc_runs_the_contract_and_real_srun_takes_ddpctls_flags(slurm):
    """salloc runs ddpctl on the submitting host (ctl); ddpctl's srun, recorded on its way to the
    real one, has every flag lib/slurm/slurm.cpp gives it, and the real srun took them all."""
    s, c = slurm, slurm.c
    shim = os.path.join(c.dir, "shim")
    os.makedirs(shim)
    record = os.path.join(c.dir, "srun-argv")
    with open(os.path.join(shim, "srun"), "w") as f:
        # argv, one word a line, and the length of the secret in srun's environment (never its value)
        f.write(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {record}\necho \"${{#DDP_AGENT_SECRET}}\" > {record}.secret\n"
                "exec /usr/bin/srun \"$@\"\n")
    os.chmod(os.path.join(shim, "srun"), 0o755)
    out_dir = os.path.join(c.dir, "out-salloc")
    os.makedirs(out_dir)
    spec = job_file(c, "salloc", [PY, s.worker, "once", out_dir], nproc=2)
    r = s.run(c.ctl, ["salloc", "--nodes=3", "--partition=main", "--job-name=salloc", "ddpctl", "launch", "--slurm",
                      "--srun-arg=--partition=main", spec],
              timeout=90, cwd=c.dir, env=s.env(PATH=f"{shim}:{c.bin}:/usr/sbin:/usr/bin:/sbin:/bin"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "salloc: Granted job allocation" in r.stderr, r.stderr
    check_contract(contracts(r.stdout), c.hosts[:3])
    argv = open(record).read().splitlines()
    for flag in ("--nodes=3", "--ntasks=3", "--ntasks-per-node=1", "--nodelist=n[1-3]", "--overlap", "--whole",
                 "--mem=0", "--cpu-bind=none", "--kill-on-bad-exit=1", "--export=ALL", "--input=none", "--label",
                 "--unbuffered", "--mpi=none", "--job-name=ddpctl-salloc", "--partition=main"):
        assert flag in argv, (flag, argv)
    agent = argv.index(os.path.join(c.bin, "ddp-agentd"))
    assert argv.index("--partition=main") < agent
    assert argv[agent + 1:] == ["--oneshot", "--listen", "[::]:0", "--secret-env", "DDP_AGENT_SECRET", "--announce"]
    assert open(record + ".secret").read().strip() == "64"  # in srun's environment only
    assert_nothing_left(s, c.hosts[:3])


def test_a_failing_rank_fails_the_job_with_ddpctls_exit_status(slurm):
    s = slurm
    job = Job(s, "fail", "fail")
    info = job.info()
    text = job.text()
    # ddpctl's exit status 1 (the job failed) is the batch job's: FAILED, ExitCode 1:0.
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "1:0", (info, text)
    assert "rank 4" in text and "7" in text, text
    result = json.load(open(job.result))
    assert result["status"] == "failed", result
    assert_nothing_left(s, job.hosts)


def test_scancel_leaves_nothing_on_any_node(slurm):
    s = slurm
    job = Job(s, "cancel", "sleep")
    job.wait_contracts(6)
    # One cgroup per node, made by its agent for the workers: checked empty below.
    assert len(job.cgroups) == 3, job.cgroups
    r = s.ctl("scancel", job.id)
    assert r.returncode == 0, r.stderr
    info = job.info()
    assert info["JobState"] == "CANCELLED", info
    assert_nothing_left(s, job.hosts, job.pids)
    # Not asserted: that every rank had its SIGTERM handler run. scancel signals every process of
    # the step at once, shepherds included, and a shepherd's SIGTERM kills its workers at once
    # (seen: 2 of 6 ranks' handlers ran), so under scancel the ranks get no stop.grace.


def test_scancel_signal_usr1_batch_reaches_every_rank(slurm):
    """The README's sbatch example: SLURM signals the batch shell only (B:USR1, here scancel
    --batch), which is ddpctl (exec); ddpctl passes it to every rank on every node."""
    s = slurm
    job = Job(s, "usr1", "usr1")
    job.wait_contracts(6)
    r = s.ctl("scancel", "--signal=USR1", "--batch", job.id)
    assert r.returncode == 0, r.stderr
    info = job.info()
    # Each rank ends 0 once it got SIGUSR1: the job completes.
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, job.text())
    assert job.signals() == {f"SIGUSR1-rank{r}": job.hosts[r // 2].name for r in range(6)}, job.text()
    assert "SIGUSR1: passing it to every worker on 3 nodes" in job.text(), job.text()
    assert_nothing_left(s, job.hosts, job.pids)


def test_usr2_then_sigterm_to_the_batch_shell(slurm):
    """SIGUSR2 to the batch shell reaches every rank and the job goes on; SIGTERM to it stops the
    job (ddpctl's 143 is the batch job's exit code), every rank asked to stop first."""
    s = slurm
    job = Job(s, "usr2", "sleep")
    job.wait_contracts(6)
    assert s.ctl("scancel", "--signal=USR2", "--batch", job.id).returncode == 0
    want = {f"SIGUSR2-rank{r}": job.hosts[r // 2].name for r in range(6)}
    assert job.wait_signals(6) == want, job.text()
    assert s.job(job.id)["JobState"] == "RUNNING"
    assert s.ctl("scancel", "--signal=TERM", "--batch", job.id).returncode == 0
    info = job.info()
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "143:0", (info, job.text())
    want.update({f"SIGTERM-rank{r}": job.hosts[r // 2].name for r in range(6)})
    assert job.signals() == want, job.text()
    assert json.load(open(job.result))["status"] == "stopped"
    assert_nothing_left(s, job.hosts, job.pids)


def test_tls_hides_the_job_from_the_wire(slurm):
    """salloc on ctl, the agent on n1: the launch's link crosses n1's interface. The marker a
    worker prints crosses in clear without --tls (the control), nowhere with it."""
    s, c = slurm, slurm.c
    n1 = c.hosts[0]
    worker = c.write("worker-echo.py", "import sys\nprint('ECHO ' + sys.argv[1], flush=True)\n")
    marker = "marker-" + os.urandom(8).hex()
    spec = job_file(c, "slurmtls", [PY, worker, marker])

    def launch(*extra):
        return s.run(c.ctl, ["salloc", "--nodes=1", "--nodelist=n1", "--partition=main", "ddpctl", "launch",
                             "--slurm", *extra, spec], timeout=60, cwd=c.dir)

    r, wire = captured(c, n1, launch)
    assert r.returncode == 0, r.stdout + r.stderr
    assert marker.encode() in wire, "the capture saw no plaintext job: it would prove nothing below"
    r, wire = captured(c, n1, lambda: launch("--tls"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"ECHO {marker}" in r.stdout, r.stdout + r.stderr
    assert len(wire) > 2000, "nothing captured"
    assert marker.encode() not in wire
    assert_nothing_left(s, [n1])


def test_a_nodes_slurmd_killed(slurm):
    s = slurm
    job = Job(s, "slurmdkill", "sleep", sbatch=["--no-requeue"])
    job.wait_contracts(6)
    n2 = s.c.hosts[1]
    slurmd = s.daemons[f"slurmd-{n2.name}"]
    assert open(f"/proc/{slurmd.pid}/comm").read().strip() == "slurmd"
    os.kill(slurmd.pid, signal.SIGKILL)
    slurmd.wait(timeout=10)
    del s.daemons[f"slurmd-{n2.name}"]
    try:
        check_slurmd_killed(s, job, n2)
    finally:
        # The node comes back when its slurmd does (ReturnToService=2), for the tests after this one.
        s.start_slurmd(n2)
    s.wait_idle([n2])


def check_slurmd_killed(s, job, n2):
    info = job.info(timeout=90)
    assert info["JobState"] == "NODE_FAIL", (info, job.text())
    assert "srun: error: Node failure on n2" in job.text(), job.text()
    assert s.node_states()[n2.name] == "down*"  # "*": not responding
    assert_nothing_left(s, job.hosts, job.pids)
    # n2's ranks, which SLURM cannot reach without n2's slurmd, were stopped by their agent, asked
    # by ddpctl (SIGTERM, then the grace). n1's and n3's are SIGTERMed by SLURM with their
    # shepherds, which kill them at once: their handlers may not run (see the scancel test).
    signals = job.signals()
    assert {k: signals.get(k) for k in ("SIGTERM-rank2", "SIGTERM-rank3")} == \
        {"SIGTERM-rank2": n2.name, "SIGTERM-rank3": n2.name}, (signals, job.text())


def launcher_pids(pids):
    """The `ddpctl launch` processes among `pids`, not its guardian (same command line)."""
    return [pid for pid in pids if proc_argv(pid)[:2] == ["ddpctl", "launch"] and proc_comm(pid) != GUARDIAN_COMM]


def test_an_agent_killed_fails_the_job_and_leaves_nothing(slurm):
    """kill -9 of n2's agent: srun's --kill-on-bad-exit=1 ends the agents' step, ddpctl fails the
    job naming n2, and the batch job fails with ddpctl's exit status."""
    s = slurm
    job = Job(s, "agentkill", "sleep")
    job.wait_contracts(6)
    n2 = s.c.hosts[1]
    agents = [pid for pid in n2.ns_pids() if "ddp-agentd" in " ".join(proc_argv(pid)) and "--oneshot" in proc_argv(pid)]
    assert len(agents) == 1, [proc_argv(p) for p in n2.ns_pids()]
    os.kill(agents[0], signal.SIGKILL)
    info = job.info()
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "1:0", (info, job.text())
    assert "node n2" in job.text(), job.text()
    assert_nothing_left(s, job.hosts, job.pids)


def test_ddpctl_killed_in_the_batch_step_leaves_nothing(slurm):
    """kill -9 of ddpctl (the batch shell, after exec): the batch step ends, SLURM ends the job and
    its agents' step, and nothing is left on any node."""
    s = slurm
    job = Job(s, "ctlkill", "sleep")
    job.wait_contracts(6)
    n1 = s.c.hosts[0]
    ctl = launcher_pids(n1.ns_pids())
    assert len(ctl) == 1, [proc_argv(p) for p in n1.ns_pids()]
    os.kill(ctl[0], signal.SIGKILL)
    info = job.info()
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "0:9", (info, job.text())
    assert_nothing_left(s, job.hosts, job.pids)


def test_ddpctl_killed_in_an_salloc_shell_ends_its_step(slurm):
    """kill -9 of ddpctl run from an salloc shell, which stays (and its allocation with it): srun
    gets SIGTERM through its parent-death signal and passes it to the agents, which stop their
    workers. Nothing is left on any node while the allocation still runs."""
    s, c = slurm, slurm.c
    out_dir = os.path.join(c.dir, "out-sallockill")
    os.makedirs(out_dir)
    spec = job_file(c, "sallockill", [PY, s.worker, "sleep", out_dir], nproc=2)
    stop = os.path.join(c.dir, "sallockill.stop")
    script = c.write("sallockill.sh", f"#!/bin/sh\nddpctl launch --slurm {spec}\necho \"ddpctl ended $?\"\n"
                                      f"for i in $(seq 600); do [ -e {stop} ] && exit 0; sleep 0.1; done\nexit 1\n")
    p = s.popen(c.ctl, ["salloc", "--nodes=3", "--partition=main", "--job-name=sallockill", script],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=c.dir)
    simcluster.wait_for_contracts(p, 6)
    hosts = c.hosts[:3]
    pids = {pid for h in hosts for pid in h.ns_pids()}
    assert len(s.agent_cgroups(pids)) == 3
    ctl = launcher_pids(c.ctl.ns_pids())
    assert len(ctl) == 1, [proc_argv(pid) for pid in c.ctl.ns_pids()]
    os.kill(ctl[0], signal.SIGKILL)
    assert_nothing_left(s, hosts, pids)
    r = s.ctl("squeue", "--noheader", "--name=sallockill", "--format=%T")
    assert r.stdout.split() == ["RUNNING"], r.stdout + r.stderr  # SLURM did not do it: the allocation is alive
    open(stop, "w").close()
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0 and "ddpctl ended 137" in out, out + err


def test_a_step_srun_cannot_create_fails_the_launch(slurm):
    """A --srun-arg the cluster cannot satisfy (a GPU on nodes without any): the real srun refuses
    the step, and ddpctl stops with exit status 2, showing srun's reason."""
    s = slurm
    job = Job(s, "refused", "once", script_args="--srun-arg=--gres=gpu:1")
    info = job.info()
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "2:0", (info, job.text())
    assert "srun| srun: error: Invalid generic resource (gres) specification" in job.text(), job.text()
    assert "srun ended (exit status 1) before the agents on n[1-3] announced themselves" in job.text(), job.text()
    assert "CONTRACT" not in job.text()
    assert_nothing_left(s, job.hosts)


def test_a_time_limit_stops_the_job_and_leaves_nothing(slurm):
    s = slurm
    job = s.limit
    job.wait_contracts(2)
    info = job.info(timeout=120)
    assert info["JobState"] == "TIMEOUT", (info, job.text())
    assert f"*** JOB {job.id} ON n4 CANCELLED AT" in job.text() and "DUE TO TIME LIMIT ***" in job.text(), job.text()
    assert "CONTRACT" in job.text()  # it had run until then
    assert_nothing_left(s, job.hosts, job.pids)
