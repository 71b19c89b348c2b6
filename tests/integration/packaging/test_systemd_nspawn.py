"""systemd for real: the built .deb packages installed into a Debian 12 tree (test_deb's cached
debootstrap tarball, build/debootstrap/), booted with systemd-nspawn (systemd 252 as PID 1, a
network namespace of its own holding only lo), and checked the way an admin would: `systemctl
enable --now ddp-agentd` (Type=notify: active once it listens), a job's ranks in a transient unit
of its own started over systemd's API, the watchdog restarting an agent that stops answering
(SIGSTOP), `systemctl stop ddp-agentd` with a job running (no worker left), the agent's lines
in journald with the job id and rank as fields, `apt-get remove` with a job running, and an
upgrade with the agent running.

How: nspawn runs with --register=no --keep-unit (this host's PID 1 is not systemd, so there is
no machined to register with) and --notify-ready=yes; the test owns nspawn's NOTIFY_SOCKET and
learns the container's PID 1 (X_NSPAWN_LEADER_PID) and its readiness from it. Everything else
runs INSIDE the container through `nsenter -t <its PID 1> -a`, over its loopback: nothing
connects into it from here. The packages are installed with apt in a chroot before the boot
(dependencies from Debian's mirror, as test_deb does; the booted container has no network).
The container is stopped by SIGTERM to the nspawn process the test started (systemd inside
powers off), bounded; its tree is removed.

Stand-in: tests/integration/agent/test_job_units.py (fake_systemd1) stays for what this test
does not show (each property of StartTransientUnit, the refusal when the bus is missing).

Time budget: 3 minutes on CI's 2 cores once the debootstrap tarball is cached (test_deb makes it,
about 2 minutes, the first time) and the packages are built. Measured here on 2 shared cores:
80 s (apt install 15 s, boot 2 s, the watchdog 17 s of which 6 s watch it not fire), 210 s at a
load of 20 (unpacking 27 s, apt 38 s); the phases' times are printed at the end (pytest -s)."""
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

from test_deb import chroot_tarball, in_chroot, packages  # noqa: F401 (packages: a fixture)

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="systemd-nspawn and debootstrap need root"),
    pytest.mark.skipif(shutil.which("debootstrap") is None, reason="debootstrap is not installed (scripts/setup)"),
    pytest.mark.skipif(shutil.which("systemd-nspawn") is None,
                       reason="systemd-nspawn is not installed (scripts/setup installs systemd-container)"),
]

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TIMES = {}


class Lines:
    """A process's stdout read line by line against a deadline (select, no polling)."""

    def __init__(self, proc):
        self.proc = proc
        self.buf = b""
        self.seen = []

    def wait_for(self, pred, timeout):
        """The first line (decoded) for which pred is true, or None at the deadline or EOF."""
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while True:
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                text = line.decode(errors="replace")
                self.seen.append(text)
                if pred(text):
                    return text
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self.buf += chunk

    def text(self):
        return "\n".join(self.seen) + "\n" + self.buf.decode(errors="replace")


class Container:
    def __init__(self, root: Path, log: Path):
        self.root = root
        self.log = log
        self.nspawn = None
        self.leader = None
        self.procs = []

    def boot(self, timeout=90):
        sockdir = tempfile.mkdtemp(prefix="nspawn-")  # short: a unix socket's path has 108 bytes
        path = os.path.join(sockdir, "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.bind(path)
            self.nspawn = subprocess.Popen(
                ["systemd-nspawn", "-D", str(self.root), "--register=no", "--keep-unit", "--private-network", "-b",
                 "--notify-ready=yes", "--console=passive"],
                env=dict(os.environ, NOTIFY_SOCKET=path), stdin=subprocess.DEVNULL, stdout=open(self.log, "w"),
                stderr=subprocess.STDOUT)
            exited = os.pidfd_open(self.nspawn.pid)
            deadline = time.monotonic() + timeout
            ready = False
            try:
                while not ready:
                    left = deadline - time.monotonic()
                    r, _, _ = select.select([sock, exited], [], [], max(left, 0))
                    assert r, f"the container did not boot within {timeout} s:\n{self.log.read_text()[-3000:]}"
                    assert exited not in r, f"systemd-nspawn exited:\n{self.log.read_text()[-3000:]}"
                    msg = sock.recv(4096).decode()
                    m = re.search(r"X_NSPAWN_LEADER_PID=(\d+)", msg)
                    if m:
                        self.leader = int(m.group(1))
                    ready = "READY=1" in msg.split("\n")
            finally:
                os.close(exited)
        finally:
            sock.close()
            shutil.rmtree(sockdir)
        assert self.leader, "systemd-nspawn did not say its container's PID 1 (X_NSPAWN_LEADER_PID)"

    def argv(self, script):
        return ["nsenter", "-t", str(self.leader), "-a", "env", "-i", f"PATH={PATH}", "HOME=/root", "LANG=C.UTF-8",
                "/bin/sh", "-c", script]

    def sh(self, script, timeout=60):
        return subprocess.run(self.argv(script), capture_output=True, text=True, timeout=timeout)

    def ok(self, script, timeout=60):
        r = self.sh(script, timeout)
        assert r.returncode == 0, f"{script}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
        return r.stdout

    def popen(self, script):
        p = subprocess.Popen(self.argv(script), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.procs.append(p)
        return Lines(p)

    def stop(self, timeout=60):
        """SIGTERM to our nspawn: systemd inside powers off; SIGKILL to its PID 1 past the bound."""
        for p in self.procs:
            if p.poll() is None:
                p.kill()  # nsenter (the processes it started inside end with the container)
            p.wait(timeout=30)
        if self.nspawn is None or self.nspawn.poll() is not None:
            return
        self.nspawn.send_signal(signal.SIGTERM)
        try:
            self.nspawn.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            if self.leader:
                os.kill(self.leader, signal.SIGKILL)  # the namespace's init: everything inside ends
            self.nspawn.kill()
            self.nspawn.wait(timeout=30)


@pytest.fixture(scope="module")
def box(packages, tmp_path_factory):  # noqa: F811 (packages: test_deb's fixture)
    t0 = time.monotonic()
    tmp = tmp_path_factory.mktemp("nspawn")
    root = tmp / "root"
    root.mkdir()
    with tarfile.open(chroot_tarball()) as t:
        t.extractall(root, numeric_owner=True)
    TIMES["unpack"] = time.monotonic() - t0
    shutil.copy("/etc/resolv.conf", root / "etc" / "resolv.conf")
    # Not /tmp: the booted system mounts a tmpfs there, hiding what the chroot saw.
    (root / "var" / "cache" / "ddptest").mkdir()
    for deb in packages.values():
        shutil.copy(deb, root / "var" / "cache" / "ddptest" / deb.name)
    debs = " ".join(f"/var/cache/ddptest/{d.name}" for d in packages.values())
    t1 = time.monotonic()
    r = in_chroot(root, "apt-get update -qq && DEBIAN_FRONTEND=noninteractive "
                        f"apt-get install -y -qq --no-install-recommends {debs}")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    TIMES["apt install"] = time.monotonic() - t1
    # An upgrade: the same package at a higher version (dpkg-deb repack), for the last test.
    agent = packages["ddp-agentd"]
    work = tmp / "repack"
    subprocess.run(["dpkg-deb", "-R", str(agent), str(work)], check=True)
    control = work / "DEBIAN" / "control"
    control.write_text(re.sub(r"(?m)^Version: .*$", "Version: 0.1.1~test", control.read_text()))
    subprocess.run(["dpkg-deb", "-b", str(work), str(root / "var" / "cache" / "ddptest" / "ddp-agentd_upgrade.deb")], check=True,
                   capture_output=True)
    # The coordinators' secret, as the unit's header says: /etc/ddpctl/token, mode 0600.
    fd = os.open(root / "etc" / "ddpctl" / "token", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(os.urandom(32).hex() + "\n")
    c = Container(root, tmp / "nspawn.log")
    t2 = time.monotonic()
    try:
        c.boot()
        out = c.sh("timeout 60 systemctl is-system-running --wait", timeout=90)
        # "degraded" would name a failed unit of the base system, not ours; say which.
        assert out.stdout.strip() in ("running", "degraded"), out.stdout + out.stderr
        TIMES["boot"] = time.monotonic() - t2
        c.agent_debs = {name: f"/var/cache/ddptest/{d.name}" for name, d in packages.items()}
        yield c
    finally:
        c.stop()
        TIMES["total"] = time.monotonic() - t0
        print("\nsystemd-nspawn test phases (s): " + ", ".join(f"{k} {v:.1f}" for k, v in TIMES.items()))
        shutil.rmtree(tmp, ignore_errors=True)


def show(c, unit, *props):
    out = c.ok(f"systemctl show {unit} " + " ".join(f"-p {p}" for p in props))
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def listening(c):
    """A connection to the agent's port succeeds now (bash's /dev/tcp; the tree has no nc)."""
    return c.sh("exec bash -c 'exec 3<>/dev/tcp/127.0.0.1/29410'").returncode == 0


# Each worker reports its rank, its pid, its parent (the shepherd), the shepherd's parent and its
# own cgroup, then waits on a FIFO of its own until the test opens and closes it (no polling).
WORKER = ('ppid=$PPID; sp=$(sed -n "s/^PPid:[[:space:]]*//p" /proc/$ppid/status); '
          'echo "worker rank=$RANK pid=$$ shepherd=$ppid shepherd_parent=$sp cgroup=$(sed -n "s/^0:://p" /proc/self/cgroup)"; '
          'exec cat /run/ddptest/go-$RANK')


def start_job(c, name):
    """ddpctl launch inside, in the background, 2 ranks blocked on the FIFO; returns the Lines and
    the workers' reports once both ran."""
    c.ok("mkdir -p /run/ddptest && rm -f /run/ddptest/go-* && mkfifo /run/ddptest/go-0 /run/ddptest/go-1")
    job = f"name: {name}\ncommand: [/bin/sh, -c, '{WORKER}']\nnproc_per_node: 2\n"
    c.ok(f"cat > /root/{name}.yaml <<'EOF'\n{job}EOF")
    lines = c.popen(f"cd /root && exec timeout 120 ddpctl launch --nodes 127.0.0.1 --token-file /etc/ddpctl/token "
                    f"{name}.yaml")
    reports = []
    for _ in range(2):
        line = lines.wait_for(lambda s: "worker rank=" in s, 60)
        assert line, "the job's workers did not start:\n" + lines.text()
        reports.append(dict(kv.split("=", 1) for kv in line.split("worker ", 1)[1].split()))
    return lines, sorted(reports, key=lambda r: r["rank"])


def release(c):
    """Opens and closes each worker's FIFO (the open waits for its reader): each cat sees EOF."""
    c.ok("exec 3>/run/ddptest/go-0 4>/run/ddptest/go-1", timeout=30)


def job_units(c):
    out = c.ok("systemctl list-units --all --plain --no-legend 'ddp-job-*'")
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def alive(c, pid):
    return c.sh(f"test -d /proc/{pid}").returncode == 0


def test_enable_now_makes_the_agent_active_once_it_listens(box):
    t0 = time.monotonic()
    # Type=notify: `systemctl enable --now` returns once the agent said READY=1, which it says
    # once it listens; so the port answers at once, with no waiting.
    box.ok("systemctl enable --now ddp-agentd && exec bash -c 'exec 3<>/dev/tcp/127.0.0.1/29410'")
    s = show(box, "ddp-agentd", "ActiveState", "SubState", "Type", "StatusText", "UnitFileState", "NRestarts")
    assert s["ActiveState"] == "active" and s["SubState"] == "running" and s["Type"] == "notify", s
    assert s["UnitFileState"] == "enabled" and s["NRestarts"] == "0", s
    assert s["StatusText"].startswith("idle, listening on"), s
    log = box.ok("journalctl -u ddp-agentd -o cat --no-pager")
    # A minimal Debian has systemd but no dbus-daemon: the agent reaches systemd on its own socket.
    assert "each job's shepherd runs in a transient systemd unit" in log, log
    TIMES["enable"] = time.monotonic() - t0


def test_each_job_runs_its_ranks_in_a_transient_unit_of_its_own(box):
    t0 = time.monotonic()
    agent_pid = show(box, "ddp-agentd", "MainPID")["MainPID"]
    units_before = job_units(box)
    lines, reports = start_job(box, "inunit")
    units = job_units(box)
    new = [u for u in units if u not in units_before]
    assert len(new) == 1 and re.fullmatch(rf"ddp-job-inunit-.*-{agent_pid}-\d+\.service", new[0]), units
    unit = new[0]
    s = show(box, unit, "ActiveState", "ControlGroup", "Delegate", "KillMode", "MainPID", "Transient")
    assert s["ActiveState"] == "active" and s["Transient"] == "yes", s
    assert s["Delegate"] == "yes" and s["KillMode"] == "control-group", s
    for r in reports:
        # Both ranks under the job's unit (an attempt's cgroup the shepherd made below it), the
        # shepherd is the unit's main process and PID 1's child, not the agent's.
        assert r["cgroup"].startswith(s["ControlGroup"] + "/"), (r, s)
        assert r["shepherd"] == s["MainPID"] and r["shepherd_parent"] == "1", (r, s)
    release(box)
    assert lines.wait_for(lambda s: "succeeded" in s, 60), lines.text()
    assert lines.proc.wait(timeout=30) == 0, lines.text()
    TIMES["job in unit"] = time.monotonic() - t0


def test_the_watchdog_restarts_an_agent_that_stops_answering(box):
    t0 = time.monotonic()
    # The shipped WatchdogSec=30s plus RestartSec=5s would spend a fifth of the budget waiting; an
    # admin's drop-in shortens it, the mechanism (the agent pinging at half of it) is the same.
    box.ok("mkdir -p /etc/systemd/system/ddp-agentd.service.d && printf '[Service]\\nWatchdogSec=3s\\n' > "
           "/etc/systemd/system/ddp-agentd.service.d/test-watchdog.conf && systemctl daemon-reload && "
           "systemctl restart ddp-agentd")
    s = show(box, "ddp-agentd", "MainPID", "WatchdogUSec", "RestartUSec", "NRestarts")
    assert s["WatchdogUSec"] == "3s" and s["RestartUSec"] == "5s", s
    journal = box.popen("exec journalctl -f -n 0 -o json UNIT=ddp-agentd.service")
    # Answering: no watchdog timeout in twice WatchdogSec (the agent pings).
    timeout = journal.wait_for(lambda line: "Watchdog timeout" in line, 6)
    assert timeout is None, timeout
    assert show(box, "ddp-agentd", "NRestarts")["NRestarts"] == "0"
    stopped = time.monotonic()
    box.ok(f"kill -STOP {s['MainPID']}")
    # systemd notices within WatchdogSec (SIGABRT, then SIGCONT), restarts after RestartSec.
    assert journal.wait_for(lambda line: "Watchdog timeout" in line, 3 + 5), journal.text()
    noticed = time.monotonic() - stopped
    started = journal.wait_for(lambda line: json.loads(line).get("MESSAGE", "").startswith("Started ddp-agentd"),
                               5 + 15)
    assert started, journal.text()
    restarted = time.monotonic() - stopped
    after = show(box, "ddp-agentd", "MainPID", "ActiveState", "NRestarts", "Result")
    assert after["ActiveState"] == "active" and after["NRestarts"] == "1", after
    assert after["MainPID"] != s["MainPID"] and not alive(box, s["MainPID"]), (s, after)
    assert listening(box)
    print(f"\nwatchdog: timeout noticed {noticed:.1f} s after SIGSTOP, active again after {restarted:.1f} s")
    box.ok("rm /etc/systemd/system/ddp-agentd.service.d/test-watchdog.conf && systemctl daemon-reload")
    TIMES["watchdog"] = time.monotonic() - t0


def test_stopping_the_agent_with_a_job_running_leaves_no_worker(box):
    t0 = time.monotonic()
    box.ok("systemctl start ddp-agentd")
    lines, reports = start_job(box, "stopped")
    units = [u for u in job_units(box) if u.startswith("ddp-job-stopped-")]
    assert len(units) == 1, units
    cgroup = show(box, units[0], "ControlGroup")["ControlGroup"]
    procs = f"cat $(find /sys/fs/cgroup/unified{cgroup} /sys/fs/cgroup{cgroup} -name cgroup.procs 2>/dev/null) 2>/dev/null"
    held = box.sh(procs).stdout.split()
    assert {r["pid"] for r in reports} <= set(held), (reports, held)  # the check below can see them
    box.ok("systemctl stop ddp-agentd")
    # The agent stops its workers before it exits, and systemctl stop returns after that.
    for r in reports:
        assert not alive(box, r["pid"]), r
    # The coordinator hears the job stopped (not a hang), and the job's unit ends with nothing
    # left in its cgroup: systemctl stop on it must find it gone or empty.
    assert lines.proc.wait(timeout=60) != 0, lines.text()
    left = box.sh(procs)
    assert left.stdout.strip() == "", left.stdout
    assert show(box, units[0], "ActiveState")["ActiveState"] in ("inactive", "failed"), units
    TIMES["stop"] = time.monotonic() - t0


def test_the_agents_lines_in_the_journal_carry_the_job_and_rank(box):
    t0 = time.monotonic()
    box.ok("systemctl start ddp-agentd")
    job = "name: journal\ncommand: [/bin/sh, -c, 'if [ $RANK = 1 ]; then exit 3; fi; exec sleep 120']\nnproc_per_node: 2\n"
    box.ok(f"cat > /root/journal.yaml <<'EOF'\n{job}EOF")
    r = box.sh("cd /root && timeout 120 ddpctl launch --nodes 127.0.0.1 --token-file /etc/ddpctl/token journal.yaml",
               timeout=150)
    launched = r.stdout + r.stderr
    assert r.returncode not in (0, 124), launched
    assert re.search(r"first failure: rank 1 \(.*\) exited with code 3", launched), launched

    # journald reads its socket asynchronously, and `journalctl --sync` on systemd 252 can return
    # before a datagram still queued there is written: look again until the lines are there.
    def look():
        out = box.ok("journalctl --sync && journalctl -o json --no-pager _SYSTEMD_UNIT=ddp-agentd.service DDP_RANK=1")
        failed = [e for e in map(json.loads, out.splitlines()) if e.get("DDP_JOB_ID", "").startswith("journal-")]
        if len(failed) != 1:
            return out, failed, []
        job_lines = box.ok(f"journalctl -o json --no-pager _SYSTEMD_UNIT=ddp-agentd.service "
                           f"DDP_JOB_ID={failed[0]['DDP_JOB_ID']}")
        return out, failed, [json.loads(line)["MESSAGE"] for line in job_lines.splitlines()]

    deadline = time.monotonic() + 20
    while True:
        out, failed, messages = look()
        if (failed and len(messages) >= 3) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(failed) == 1, (out, launched, box.sh("journalctl -o short --no-pager -u ddp-agentd -n 40").stdout)
    e = failed[0]
    assert e["DDP_ROUND"] == "1" and e["PRIORITY"] == "4" and e["DDP_SUBSYSTEM"] == "agent", e
    assert "rank 1 exited with code 3" in e["MESSAGE"], e
    # Every line about that job is found by its id; the ones about no job carry none.
    assert len(messages) >= 3 and all(m.startswith(f"job {e['DDP_JOB_ID']}") for m in messages), messages
    TIMES["journal"] = time.monotonic() - t0


def test_apt_get_remove_with_a_job_running_leaves_no_worker(box):
    t0 = time.monotonic()
    box.ok("systemctl start ddp-agentd")
    lines, reports = start_job(box, "removed")
    out = box.ok("DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq ddp-agentd", timeout=180)
    for r in reports:
        assert not alive(box, r["pid"]), (r, out)
    assert box.sh("test -e /usr/bin/ddp-agentd").returncode != 0
    s = show(box, "ddp-agentd", "ActiveState", "LoadState")
    assert s["ActiveState"] in ("inactive", "failed"), s
    assert lines.proc.wait(timeout=60) != 0, lines.text()
    assert [u for u in job_units(box) if show(box, u, "ActiveState")["ActiveState"] == "active"] == []
    TIMES["apt remove"] = time.monotonic() - t0


def test_an_upgrade_restarts_the_running_agent_on_the_new_package(box):
    t0 = time.monotonic()
    box.ok(f"dpkg -i {box.agent_debs['ddp-agentd']} && systemctl enable --now ddp-agentd", timeout=120)
    before = show(box, "ddp-agentd", "MainPID", "ActiveState")
    assert before["ActiveState"] == "active", before
    # The postinst's try-restart: the running agent is replaced (here by the same binary, so the
    # package's version is what tells them apart), the admin's token and enablement are kept.
    box.ok("dpkg -i /var/cache/ddptest/ddp-agentd_upgrade.deb", timeout=120)
    after = show(box, "ddp-agentd", "MainPID", "ActiveState", "UnitFileState")
    assert after["ActiveState"] == "active" and after["UnitFileState"] == "enabled", after
    assert after["MainPID"] != before["MainPID"] and not alive(box, before["MainPID"]), (before, after)
    assert box.ok("dpkg-query -W -f='${Version}' ddp-agentd") == "0.1.1~test"
    assert box.ok("stat -c %a /etc/ddpctl/token").strip() == "600"
    assert listening(box)
    TIMES["upgrade"] = time.monotonic() - t0
