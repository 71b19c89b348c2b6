"""Jobs in transient systemd units (agent.yaml's job_units), and the shepherd fork without them.

systemd is not PID 1 here: the unit path runs against tests/integration/agent/fake_systemd1.cpp,
a stand-in that owns org.freedesktop.systemd1 on a private dbus-daemon the test starts (the
agent finds it through DBUS_SYSTEM_BUS_ADDRESS), records every property of
StartTransientUnit and runs the shepherd as its own child, as systemd would. What systemd
itself does with the properties (cgroups, KillMode) is not imitated; docs/architecture.md
gives the reasoning. Everything runs on loopback and unix sockets in the test's folder.

The real systemd (cgroups, Delegate, KillMode, the shepherd as PID 1's child, no worker left
after `systemctl stop`) is checked by tests/integration/packaging/test_systemd_nspawn.py in a
Debian 12 booted with systemd-nspawn; this stand-in stays for what that one does not show:
every property of the call, the refusal without a bus, the kill after the agent's SIGKILL and
the fork outside systemd."""
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from ddptest import BINARY_DIR, free_port

AGENTD = str(BINARY_DIR / "bin" / "ddp-agentd")
DDPCTL = str(BINARY_DIR / "bin" / "ddpctl")
FAKE_SYSTEMD = str(BINARY_DIR / "tests" / "fake_systemd1")

# Each worker reports its parent (the shepherd), the shepherd's parent and its own cgroup.
REPORT = r'''
import json, os
ppid = os.getppid()
shepherd_parent = int([l for l in open(f"/proc/{ppid}/status") if l.startswith("PPid:")][0].split()[1])
cgroup = [l.strip()[3:] for l in open("/proc/self/cgroup") if l.startswith("0::")][0]
shepherd_argv = open(f"/proc/{ppid}/cmdline").read().split("\0")
print("report", json.dumps({"shepherd": ppid, "shepherd_parent": shepherd_parent, "cgroup": cgroup,
                            "shepherd_argv": shepherd_argv}), flush=True)
'''


class Env:
    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.procs = []
        self.token = tmp / "token"
        fd = os.open(self.token, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(os.urandom(32).hex() + "\n")
        self.port = free_port()
        self.agent_log = tmp / "agent.log"
        (tmp / "report.py").write_text(REPORT)

    def popen(self, argv, **kw):
        p = subprocess.Popen(argv, **kw)
        self.procs.append(p)
        return p

    def start_bus(self):
        """A private dbus-daemon (the session bus configuration: this user may own any name)."""
        self.bus = self.popen(["dbus-daemon", "--session", "--nofork", "--nopidfile",
                               f"--address=unix:path={self.tmp}/bus", "--print-address=1"],
                              stdout=subprocess.PIPE, text=True)
        address = self.bus.stdout.readline().strip()
        assert address.startswith("unix:path="), address
        return address

    def start_fake_systemd(self, address, reply_delay_ms=0):
        self.record = self.tmp / "units.jsonl"
        p = self.popen([FAKE_SYSTEMD, str(self.record), str(reply_delay_ms)], stdout=subprocess.PIPE, text=True,
                       env=dict(os.environ, DBUS_SYSTEM_BUS_ADDRESS=address))
        assert p.stdout.readline().strip() == "ready"
        return p

    def start_agent(self, config="", env=None, cgroup=None):
        cfg = self.tmp / "agent.yaml"
        cfg.write_text(f'listen: "127.0.0.1:{self.port}"\n{config}')
        e = {k: v for k, v in os.environ.items() if k not in ("INVOCATION_ID", "DBUS_SYSTEM_BUS_ADDRESS")}
        e.update(env or {})
        argv = [AGENTD, "--config", str(cfg), "--token-file", str(self.token), "--log-dir", str(self.tmp / "logs")]
        if cgroup:  # start inside a cgroup of the test's (the agent unit's delegated one, simulated)
            argv = ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh", *argv]
        self.agent = self.popen(argv, env=e, stdout=open(self.agent_log, "w"), stderr=subprocess.STDOUT)
        return self.agent

    def wait_listening(self):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.agent.poll() is None, self.agent_log.read_text()
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        raise AssertionError("the agent does not listen:\n" + self.agent_log.read_text())

    def job(self, name, command):
        path = self.tmp / f"{name}.yaml"
        path.write_text(f"name: {name}\ncommand: {command}\nnproc_per_node: 2\nstore: {{port: {free_port()}}}\n")
        return path

    def launch(self, job):
        return subprocess.run([DDPCTL, "launch", "--nodes", f"127.0.0.1:{self.port}", "--token-file",
                               str(self.token), str(job)], cwd=self.tmp, capture_output=True, text=True, timeout=180)

    def reports(self, stdout):
        return [json.loads(line.split("report ", 1)[1]) for line in stdout.splitlines() if "report {" in line]

    def close(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=30)


@pytest.fixture
def env(tmp_path):
    e = Env(tmp_path)
    yield e
    e.close()


def needs_bus():
    assert shutil.which("dbus-daemon"), "dbus-daemon is not installed (scripts/setup installs it)"
    assert os.access(FAKE_SYSTEMD, os.X_OK), f"{FAKE_SYSTEMD} is not built: the build should have made it"


def test_with_a_bus_each_job_starts_in_a_transient_unit(env):
    needs_bus()
    address = env.start_bus()
    fake = env.start_fake_systemd(address)
    env.start_agent("job_units: systemd\n", env={"DBUS_SYSTEM_BUS_ADDRESS": address, "INVOCATION_ID": "0" * 32,
                                                   "JOURNAL_STREAM": "8:1234"})
    env.wait_listening()
    r = env.launch(env.job("inunit", f"[/usr/bin/python3, {env.tmp}/report.py]"))
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n{env.agent_log.read_text()}"
    log = env.agent_log.read_text()
    assert "each job's shepherd runs in a transient systemd unit (job_units: systemd)" in log, log

    units = [json.loads(line) for line in env.record.read_text().splitlines()]
    assert len(units) == 1, units
    unit = units[0]
    assert unit["name"].startswith("ddp-job-inunit-") and unit["name"].endswith(".service"), unit
    assert unit["mode"] == "fail"
    p = unit["properties"]
    assert p["Delegate"] is True and p["KillMode"] == "control-group" and p["Type"] == "exec", p
    assert p["CollectMode"] == "inactive-or-failed" and p["Restart"] == "no", p
    (exec_start,) = p["ExecStart"]
    assert exec_start["path"] == os.path.realpath(AGENTD), exec_start
    assert exec_start["argv"][1:3] == ["shepherd", "--agent-pid"] and exec_start["argv"][-1] == "--in-unit"
    assert p["StandardInputFileDescriptor"] == "fd" and p["StandardErrorFileDescriptor"] == "fd"
    assert any(v.startswith("PATH=") for v in p["Environment"]), p["Environment"]
    # The agent unit's own variables are not the job unit's.
    assert not any(v.startswith(("INVOCATION_ID=", "JOURNAL_STREAM=")) for v in p["Environment"]), p["Environment"]
    assert "LimitNOFILE" in p and "LimitMEMLOCK" in p
    # The shepherd runs in the "unit" and not as the agent's child, with no hardening asked.
    for key in ("User", "ProtectHome", "PrivateTmp", "NoNewPrivileges", "BindsTo"):
        assert key not in p, key
    reports = env.reports(r.stdout)
    assert len(reports) == 2, r.stdout
    for rep in reports:
        assert rep["shepherd"] == unit["pid"], (rep, unit)
        assert rep["shepherd_parent"] == fake.pid, rep
        assert rep["shepherd_argv"][-2] == "--in-unit", rep


def test_a_shepherd_in_a_unit_kills_the_job_when_the_agent_is_killed(env):
    needs_bus()
    address = env.start_bus()
    env.start_fake_systemd(address)
    agent = env.start_agent("job_units: systemd\n", env={"DBUS_SYSTEM_BUS_ADDRESS": address})
    env.wait_listening()
    pids = env.tmp / "pids"
    pids.mkdir()
    job = env.job("killed", f"[/bin/sh, -c, 'echo $$ > {pids}/$RANK; exec sleep 300']")
    launcher = env.popen([DDPCTL, "launch", "--nodes", f"127.0.0.1:{env.port}", "--token-file", str(env.token),
                          str(job)], cwd=env.tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(list(pids.iterdir())) < 2 and time.monotonic() < deadline:
        assert launcher.poll() is None, launcher.communicate()
        time.sleep(0.1)
    workers = [int(f.read_text()) for f in pids.iterdir()]
    assert len(workers) == 2
    agent.kill()
    agent.wait(timeout=30)
    deadline = time.monotonic() + 60
    alive = workers
    while alive and time.monotonic() < deadline:
        alive = [w for w in alive if os.path.exists(f"/proc/{w}")]
        time.sleep(0.1)
    assert not alive, f"workers {alive} outlived the agent"
    launcher.wait(timeout=120)
    assert launcher.returncode != 0


# A signal to the agent while it waits for systemd's answer (a worker's SIGCHLD, say) must not
# fail the start: it once failed with "System.Error.EINTR: Interrupted system call", after PID 1
# had made the unit (found under systemd-nspawn, where the retry then met UnitExists).
def test_signals_while_systemd_answers_do_not_fail_the_start(env):
    needs_bus()
    address = env.start_bus()
    env.start_fake_systemd(address, reply_delay_ms=1500)
    agent = env.start_agent("job_units: systemd\n", env={"DBUS_SYSTEM_BUS_ADDRESS": address,
                                                          "INVOCATION_ID": "0" * 32})
    env.wait_listening()
    job = env.job("signalled", f"[/usr/bin/python3, {env.tmp}/report.py]")
    launch = subprocess.Popen([DDPCTL, "launch", "--nodes", f"127.0.0.1:{env.port}", "--token-file", str(env.token),
                               str(job)], cwd=env.tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (env.record.exists() and env.record.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert env.record.exists(), "the agent never asked for a unit"
        for _ in range(5):  # the fake holds its answer 1.5 s: these land while the agent waits
            os.kill(agent.pid, signal.SIGCHLD)
            time.sleep(0.1)
        out, err = launch.communicate(timeout=120)
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.wait()
    assert launch.returncode == 0, f"{out}\n{err}\n{env.agent_log.read_text()}"
    units = [json.loads(line) for line in env.record.read_text().splitlines()]
    assert len(units) == 1 and units[0]["name"].startswith("ddp-job-signalled-"), units
    assert len(env.reports(out)) == 2, out


def test_job_units_systemd_without_a_bus_does_not_start(env):
    p = env.start_agent("job_units: systemd\n", env={"DBUS_SYSTEM_BUS_ADDRESS": f"unix:path={env.tmp}/no-bus"})
    p.wait(timeout=60)
    assert p.returncode == 2
    text = env.agent_log.read_text()
    assert "job_units: systemd, but cannot reach the system bus" in text, text
    assert "job_units: fork" in text, text


def remove_cgroup(path):
    """Our test cgroup, once the shepherd that outlives the agent by a moment has left it; what
    is still there after a minute is killed (it is ours), then the cgroup goes."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        busy = open(os.path.join(path, "cgroup.procs")).read().split() or \
            [d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d))]
        if not busy:
            break
        time.sleep(0.1)
    else:
        with open(os.path.join(path, "cgroup.kill"), "w") as f:
            f.write("1")
        time.sleep(1)
    os.rmdir(path)
    assert not busy, f"left in the agent's cgroup after it stopped: {busy}"


@pytest.mark.skipif(os.path.isdir("/run/systemd/system"), reason="systemd is the init system here")
def test_without_systemd_the_shepherd_is_forked_and_attempts_get_cgroups_inside_the_agents(env):
    # $INVOCATION_ID as systemd would set it, but systemd is not running: the fork, said why.
    cgroup = None
    mount = next((line.split()[4] for line in open("/proc/self/mountinfo") if " - cgroup2 " in line), None)
    own = next((line.strip()[3:] for line in open("/proc/self/cgroup") if line.startswith("0::")), None)
    if mount and own is not None:
        cgroup = os.path.join(mount + own.rstrip("/"), f"ddptest-agent-{os.getpid()}")
        try:
            os.mkdir(cgroup)
        except OSError:
            cgroup = None
    try:
        agent = env.start_agent(env={"INVOCATION_ID": "0123456789abcdef0123456789abcdef"}, cgroup=cgroup)
        env.wait_listening()
        r = env.launch(env.job("forked", f"[/usr/bin/python3, {env.tmp}/report.py]"))
        assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n{env.agent_log.read_text()}"
        log = env.agent_log.read_text()
        assert "each job's shepherd runs as a child of ddp-agentd (systemd is not the init system here)" in log, log
        reports = env.reports(r.stdout)
        assert len(reports) == 2, r.stdout
        for rep in reports:
            assert rep["shepherd_parent"] == agent.pid, rep
            assert "--in-unit" not in rep["shepherd_argv"], rep
            if cgroup:
                # Each attempt's cgroup is made below the agent's own (its unit's, delegated).
                base = "/" + os.path.relpath(cgroup, mount)
                assert rep["cgroup"].startswith(f"{base}/ddpctl-{rep['shepherd']}-"), (rep, base)
                assert rep["cgroup"].endswith("-a0"), rep
    finally:
        env.close()
        if cgroup:
            remove_cgroup(cgroup)
    if not cgroup:
        pytest.skip("no writable cgroup v2 here: the fork was checked, the cgroup placement was not")


@pytest.mark.parametrize("cgroup", [True, False], ids=["cgroup", "no-cgroup"])
def test_a_killed_shepherds_workers_and_what_they_started_die_with_it(env, cgroup):
    # The shepherd (here the agent's child: no systemd) is SIGKILLed. Its workers die by
    # PDEATHSIG; what they started (a child in the rank's process group, a setsid() grandchild)
    # is killed by the attempt's guardian, not left to the agent, and the launch fails.
    script = env.tmp / "tree.py"
    script.write_text("""
import os, time
def publish(name, pid):
    open(name + ".tmp", "w").write(str(pid))
    os.rename(name + ".tmp", name)
r = os.environ["RANK"]
if os.fork() == 0:
    publish(f"child-{r}.pid", os.getpid())
    while True: time.sleep(1)
if os.fork() == 0:
    os.setsid()
    publish(f"grandchild-{r}.pid", os.getpid())
    while True: time.sleep(1)
publish(f"worker-{r}.pid", os.getpid())
while True: time.sleep(1)
""")
    env.start_agent(env={"DDP_NO_CGROUP": "1"} if not cgroup else {})
    env.wait_listening()
    job = env.job("killed", f"[/usr/bin/python3, {script}]")
    launcher = env.popen([DDPCTL, "launch", "--nodes", f"127.0.0.1:{env.port}", "--token-file", str(env.token),
                          str(job)], cwd=env.tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    names = [f"{n}-{r}" for n in ("worker", "child", "grandchild") for r in (0, 1)]
    pids = {}
    try:
        deadline = time.monotonic() + 60
        while not all((env.tmp / f"{n}.pid").exists() for n in names):
            assert time.monotonic() < deadline and launcher.poll() is None, env.agent_log.read_text()
            time.sleep(0.05)
        pids = {n: int((env.tmp / f"{n}.pid").read_text()) for n in names}
        in_cgroup = "ddpctl-" in open(f"/proc/{pids['grandchild-0']}/cgroup").read()
        if cgroup and not in_cgroup:
            pytest.skip("no writable cgroup v2 here: the no-cgroup case runs beside this one")
        shepherd = int([l for l in open(f"/proc/{pids['worker-0']}/status") if l.startswith("PPid:")][0].split()[1])
        assert "shepherd" in open(f"/proc/{shepherd}/cmdline").read()
        os.kill(shepherd, signal.SIGKILL)
        _, err = launcher.communicate(timeout=60)
        assert launcher.returncode != 0, err
        assert "shepherd" in err, err
        def gone(pid):  # or a zombie its new parent has not reaped yet
            try:
                return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
            except FileNotFoundError:
                return True
        must_die = [n for n in names if cgroup or not n.startswith("grandchild")]
        deadline = time.monotonic() + 10
        while not all(gone(pids[n]) for n in must_die):
            assert time.monotonic() < deadline, [n for n in must_die if not gone(pids[n])]
            time.sleep(0.05)
    finally:
        for pid in pids.values():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
