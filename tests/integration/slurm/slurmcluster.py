"""A real SLURM cluster (Debian 12's slurm-wlm 22.05 and munge) on simulated hosts.

On top of simcluster.Cluster's network namespaces: one munged (a key the test makes, its socket
in the run's folder; a unix socket is a file, so every namespace reaches it), slurmctld on 'ctl'
and one slurmd on each node n1..nN, each in its host's network namespace with the host's own
hostname (slurmd finds its NodeName from it), /etc/hosts, and a private /tmp. All of SLURM's
state, spool, pid and log files live in the run's folder; nothing under /etc/slurm is read
(SLURM_CONF and -f point at the run's slurm.conf).

Hosts are entered with nsenter --net, not `ip netns exec`: the latter remounts /sys, hiding
/sys/fs/cgroup, which slurmd 22.05 refuses to start without.

Process tracking is proctrack/linuxproc (and task/none), not proctrack/cgroup, though the latter
works here too (tried: cgroup v1's freezer on this hybrid layout, a step in
/sys/fs/cgroup/freezer/slurm_<node>/uid_0/job_<id>/step_<n>; cgroup/v2 was not tried, the
hierarchy being hybrid). Those cgroups are machine-wide, and every run names its nodes n1..n4
and numbers its jobs from 1: two runs at once (ctest -j, another worktree) would share them,
and one run's step cleanup would kill the other's processes. linuxproc keeps all of a run's
SLURM state in its own namespaces and folders: it finds a step's processes by their parent
chain (ddp-agentd's shepherd is a subreaper, so a job's daemonized descendants stay in that
chain). The tests therefore check leftovers per network namespace: every process SLURM starts
on a node (slurmstepd, the agents, their workers) lives in that node's namespace; and the
cgroups the agents make for their workers (cgroup v2, named by the agent's pid) for processes.

Everything is stopped by what it is: the pids started here (their process groups) and whatever
still runs in a namespace the cluster made (simcluster's teardown); never by process name.
"""
import os
import re
import shutil
import signal
import subprocess
import time

import simcluster


def slurm_unavailable():
    """A reason the real cluster cannot run here, or None."""
    reason = simcluster.netns_unavailable()
    if reason:
        return reason
    for tool in ("munged", "slurmctld", "slurmd", "sbatch", "salloc", "srun", "scancel", "scontrol", "nsenter"):
        if not shutil.which(tool) and not os.access(os.path.join("/usr/sbin", tool), os.X_OK):
            return f"'{tool}' not found: scripts/setup installs slurmctld, slurmd, slurm-client and munge"
    return None


def _which(tool):
    return shutil.which(tool) or os.path.join("/usr/sbin", tool)


class SlurmCluster:
    """slurmctld on c.ctl, slurmd on every c.hosts; use as a context manager around a Cluster."""

    def __init__(self, c, cpus=4, kill_wait=10, partitions=None, proctrack="proctrack/linuxproc"):
        """partitions: {name: [hosts]} (the first is the default); else one 'main' of every host."""
        self.c = c
        self.proctrack = proctrack
        self.partitions = partitions or {"main": c.hosts}
        self.cpus = cpus
        self.kill_wait = kill_wait
        self.dir = os.path.join(c.dir, "slurm")
        os.makedirs(self.dir)
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.munge_socket = os.path.join(self.dir, "munge", "munge.socket")
        self.daemons = {}  # name -> Popen

    # ---- running things on a host ----

    def wrap(self, host, argv):
        """argv on host: its network namespace (nsenter, so /sys and its cgroups stay), its hostname,
        its /etc/hosts and a private /tmp."""
        # The state folder (env() below) is made at once, root's and 0700: one still to be made
        # in /tmp, where anyone may make it first, root does not use (safefs::usable_env_dir).
        inner = (f"hostname {host.name} && mount --bind /etc/netns/{host.ns}/hosts /etc/hosts && "
                 "mount -t tmpfs tmpfs /tmp && mkdir -m 0700 /tmp/ddp-state && exec \"$@\"")
        return ["nsenter", f"--net=/run/netns/{host.ns}", "unshare", "--uts", "--mount", "--propagation", "private",
                "sh", "-c", inner, "sh", *argv]

    def env(self, **extra):
        e = dict(os.environ)
        for k in list(e):
            if k.startswith("SLURM_"):
                del e[k]
        # The hosts share one file system except /tmp (a tmpfs each): the state folder, where each
        # node's agent keeps its job's log folders, must be per host, as on real nodes (under
        # ctest XDG_STATE_HOME names one folder for all of them, and the agents collided there).
        e.update({"SLURM_CONF": self.conf, "PATH": f"{self.c.bin}:/usr/sbin:/usr/bin:/sbin:/bin",
                  "XDG_STATE_HOME": "/tmp/ddp-state"})
        e.update(extra)
        return e

    def popen(self, host, argv, **kw):
        kw.setdefault("env", self.env())
        p = subprocess.Popen(self.wrap(host, argv), start_new_session=True, **kw)
        self.c.procs.append(p)
        return p

    def run(self, host, argv, timeout=30, **kw):
        kw.setdefault("env", self.env())
        return subprocess.run(self.wrap(host, argv), capture_output=True, text=True, timeout=timeout, **kw)

    def ctl(self, *argv, timeout=30):
        """A SLURM client command (sbatch, scancel, scontrol, ...) on the ctl host."""
        return self.run(self.c.ctl, list(argv), timeout=timeout)

    # ---- set-up ----

    def __enter__(self):
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc):
        self.stop()

    def _write(self, path, text, mode=0o644):
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, mode)

    def _start(self):
        c = self.c
        # munged: a fresh key, every folder above its socket searchable (the run's folder is 0755
        # under /var/tmp), its own pid, seed and log files.
        md = os.path.join(self.dir, "munge")
        os.makedirs(md, mode=0o755)
        key = os.path.join(md, "munge.key")
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(1024))
        log = open(os.path.join(md, "munged.out"), "ab")
        p = subprocess.Popen([_which("munged"), "--foreground", "--force", f"--key-file={key}",
                              f"--socket={self.munge_socket}", f"--pid-file={md}/munged.pid",
                              f"--seed-file={md}/munged.seed", f"--log-file={md}/munged.log", "--num-threads=4"],
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        c.procs.append(p)
        self.daemons["munged"] = p
        self._wait(lambda: os.path.exists(self.munge_socket), 10, "munged's socket", p, os.path.join(md, "munged.log"))

        d = self.dir
        for sub in ("state", "spool", "logs"):
            os.makedirs(os.path.join(d, sub))
        for h in c.hosts:
            os.makedirs(os.path.join(d, "spool", h.name))
        nodes = "".join(f"NodeName={h.name} NodeAddr={h.addr} CPUs={self.cpus} RealMemory=1000 State=UNKNOWN\n"
                        for h in c.hosts)
        parts = "".join(f"PartitionName={name} Nodes={','.join(h.name for h in hosts)} Default={'YES' if i == 0 else 'NO'} "
                        "MaxTime=INFINITE State=UP\n" for i, (name, hosts) in enumerate(self.partitions.items()))
        self._write(self.conf, f"""ClusterName=ddptest
SlurmctldHost={c.ctl.name}({c.ctl.addr})
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/spool/%n/slurmd.pid
SlurmctldLogFile={d}/logs/slurmctld.log
SlurmdLogFile={d}/logs/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType={self.proctrack}
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=5
SlurmctldTimeout=10
MessageTimeout=10
KillWait={self.kill_wait}
InactiveLimit=0
MinJobAge=600
{nodes}{parts}""")
        self._write(os.path.join(d, "cgroup.conf"), "CgroupPlugin=autodetect\n")

        ctld_log = os.path.join(d, "logs", "slurmctld.log")
        self.daemons["slurmctld"] = self.popen(c.ctl, [_which("slurmctld"), "-D", "-i", "-f", self.conf],
                                               stdout=open(ctld_log + ".out", "ab"), stderr=subprocess.STDOUT)
        c.wait_listening(c.ctl, port=6817, timeout=20)
        for h in c.hosts:
            self.start_slurmd(h)
        self.wait_idle(c.hosts)

    def start_slurmd(self, host):
        out = open(os.path.join(self.dir, "logs", f"slurmd-{host.name}.out"), "ab")
        self.daemons[f"slurmd-{host.name}"] = self.popen(host, [_which("slurmd"), "-D", "-f", self.conf],
                                                         stdout=out, stderr=subprocess.STDOUT)

    def wait_idle(self, hosts, timeout=30):
        """Until slurmctld sees every one of hosts idle."""
        self._wait(lambda: all(self.node_states().get(h.name) == "idle" for h in hosts), timeout,
                   "every node idle in sinfo", None, None)

    def hosts_of(self, partition):
        return self.partitions[partition]

    @staticmethod
    def agent_cgroups(pids):
        """The cgroups (v2) that processes among pids made for their workers (ddpctl-<pid>-...)."""
        base = None
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                if fields[fields.index("-") + 1] == "cgroup2":
                    base = fields[4]
                    break
        if base is None:
            return []
        return [os.path.join(base, n) for n in os.listdir(base)
                if n.startswith("ddpctl-") and n.split("-")[1].isdigit() and int(n.split("-")[1]) in pids]

    def _wait(self, cond, timeout, what, proc, log=None):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if cond():
                return
            if proc is not None and proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"{what}: not within {timeout} s\n{self.logs()}")

    def logs(self):
        out = []
        for root, _, files in os.walk(self.dir):
            for f in sorted(files):
                if f.endswith((".log", ".out")):
                    with open(os.path.join(root, f), errors="replace") as fh:
                        out.append(f"---- {f}\n" + "".join(fh.readlines()[-40:]))
        return "\n".join(out)

    # ---- state ----

    def node_states(self):
        r = self.ctl("sinfo", "--noheader", "--Node", "--format=%N %t", timeout=15)
        if r.returncode != 0:
            return {}
        return dict(line.split()[:2] for line in r.stdout.splitlines() if line.strip())

    def job(self, job_id):
        """scontrol show job's fields for job_id, as a dict."""
        r = self.ctl("scontrol", "show", "job", "--oneliner", str(job_id))
        assert r.returncode == 0, r.stderr
        return dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", r.stdout))

    def wait_job_state(self, job_id, states, timeout=60):
        deadline = time.time() + timeout
        info = {}
        while time.time() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in states:
                return info
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} is {info.get('JobState')} after {timeout} s, not {states}:\n{info}\n"
                             f"{self.logs()}")

    def stop(self):
        """Stops the daemons this cluster started, by pid (slurmd first, so no step restarts)."""
        for name in sorted(self.daemons, key=lambda n: (n == "munged", n == "slurmctld")):
            p = self.daemons[name]
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                    p.wait(timeout=10)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    try:
                        os.killpg(p.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        self.daemons.clear()
