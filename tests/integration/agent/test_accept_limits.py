"""Idle unauthenticated connections against a daemon with few descriptors (issue 21, item 4).

With RLIMIT_NOFILE 64, 80 idle connections that never say a word used to leave the agent's
accept failing with EMFILE and re-armed at once: a whole core spent until their handshake
deadline. Now the listener keeps at most a quarter of its descriptors' worth of unauthenticated
connections (the oldest is closed for each newcomer) and waits between failed accepts, so the
daemon stays idle and an honest coordinator still completes its handshake while the flood
lasts, and after it.

The daemons run on loopback, started by the test (their pids are the test's children)."""
import os
import resource
import socket
import subprocess
import time

import pytest

from ddptest import BINARY_DIR, free_port, wait_for
from protoclient import Client

AGENTD = str(BINARY_DIR / "bin" / "ddp-agentd")
COORDINATOR = str(BINARY_DIR / "bin" / "ddp-coordinator")
NOFILE = 64
IDLE = 80
WINDOW_S = 2.0  # well inside the 10 s handshake deadline that frees idle connections anyway


def cpu_seconds(pid):
    """utime + stime of `pid`, from /proc/PID/stat (fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def open_fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


class Daemon:
    def __init__(self, tmp_path, argv, log_name, env=None, nofile=(NOFILE, NOFILE)):
        """`nofile`: its RLIMIT_NOFILE (soft, hard); few descriptors by default."""
        self.secret = os.urandom(32).hex()
        token = tmp_path / "token"
        fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"k1: {self.secret}\n")
        self.port = free_port()
        self.log = tmp_path / log_name
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([*argv(self.port, token, tmp_path)], stdout=out, stderr=subprocess.STDOUT,
                                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, nofile),
                                         env=env)

    def wait_listening(self):
        def listening():
            assert self.proc.poll() is None, self.log.read_text()
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", self.port)) == 0
        wait_for(listening, 30, "the daemon to listen")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)


def agent_argv(port, token, tmp):
    return [AGENTD, "--listen", f"127.0.0.1:{port}", "--token-file", str(token), "--log-dir", str(tmp / "logs")]


def coordinator_argv(port, token, tmp):
    return [COORDINATOR, "--listen", f"127.0.0.1:{port}", "--token-file", str(token), "--log-dir", str(tmp / "logs")]


@pytest.mark.parametrize("kind", ["agent", "coordinator"])
def test_idle_connections_neither_spin_nor_lock_out_a_real_peer(tmp_path, kind):
    argv, role = (agent_argv, "coordinator") if kind == "agent" else (coordinator_argv, "ctl")
    d = Daemon(tmp_path, argv, f"{kind}.log")
    idle = []
    try:
        d.wait_listening()
        base_fds = open_fds(d.proc.pid)
        assert base_fds < NOFILE // 2, base_fds
        for _ in range(IDLE):
            s = socket.socket()
            s.connect(("127.0.0.1", d.port))  # completes in the kernel's backlog; says nothing
            idle.append(s)
        # The daemon has met the flood: it closes the oldest for each newcomer (said once), or
        # (before the cap) its descriptors ran out.
        wait_for(lambda: "have not authenticated yet" in d.log.read_text() or open_fds(d.proc.pid) >= NOFILE - 2, 10,
                 "the idle connections to reach the cap or the descriptor limit")
        before = cpu_seconds(d.proc.pid)
        time.sleep(WINDOW_S)  # a measuring window, not an ordering of events
        used = cpu_seconds(d.proc.pid) - before
        # Spinning on EMFILE costs ~1 s of CPU per second; idle costs next to nothing.
        assert used < 0.3 * WINDOW_S, f"{kind} used {used:.2f} s of CPU in {WINDOW_S} s with {IDLE} idle connections"
        assert open_fds(d.proc.pid) < NOFILE - 4
        # An honest peer during the flood: its connection evicts the oldest idle one.
        Client("127.0.0.1", d.port, "k1", d.secret, role=role, timeout=5).sock.close()
        for s in idle:
            s.close()
        idle.clear()
        # And afterwards, as ever.
        Client("127.0.0.1", d.port, "k1", d.secret, role=role, timeout=5).sock.close()
        assert d.proc.poll() is None
    finally:
        for s in idle:
            s.close()
        d.stop()
    text = d.log.read_text()
    # One warning for the whole episode, not one per connection.
    assert text.count("have not authenticated yet") == 1, text


def patient_agent_argv(port, token, tmp):
    """The agent, with time enough for a slow machine: its test clients do not beat, and a link
    silent for the default 6 s would be dropped for that, not for the bound under test."""
    return [*agent_argv(port, token, tmp), "--heartbeat-timeout", "120"]


def answers(c):
    """The agent still serves link `c`: a beat of ours comes back echoed in one of its own
    (what was already waiting in the socket does not count)."""
    mark = time.monotonic_ns() // 1000
    c.send("heartbeat", now_us=mark)
    while True:  # bounded by the client's socket timeout
        m = c.receive()
        if m["type"] == "heartbeat" and m.get("t0_us") == mark:
            return True


def test_one_key_holds_a_bounded_number_of_links(tmp_path):
    """An authenticated key cannot take the agent's descriptors: with 64 of them, one key may hold
    8 links (an eighth); the ninth is refused with the bound while the eight go on, and once one
    of them closes a new link is taken again."""
    d = Daemon(tmp_path, patient_agent_argv, "agent.log")
    links = []
    try:
        d.wait_listening()
        for _ in range(8):
            links.append(Client("127.0.0.1", d.port, "k1", d.secret, timeout=10))
        for c in links:
            assert answers(c)  # each is served
        extra = Client("127.0.0.1", d.port, "k1", d.secret, timeout=10)  # the handshake itself completes
        refusal = extra.receive()
        assert refusal["type"] == "error", refusal
        assert "too many links with key 'k1'" in refusal["message"] and "at most 8" in refusal["message"], refusal
        with pytest.raises((EOFError, ConnectionResetError)):
            extra.receive()
        extra.close()
        assert all(answers(c) for c in links)  # the others did not notice
        links.pop(0).close()
        again = None

        def taken():
            nonlocal again
            c = Client("127.0.0.1", d.port, "k1", d.secret, timeout=10)
            m = c.receive()
            if m["type"] == "heartbeat" and answers(c):
                again = c
                return True
            c.close()  # refused: the agent had not yet seen the closed link go
            return False

        wait_for(taken, 10, "a new link once one of the eight closed")
        links.append(again)
        assert d.proc.poll() is None
    finally:
        for c in links:
            c.close()
        d.stop()
    assert "too many links with key 'k1'" in d.log.read_text()


def test_image_lookups_at_once_are_bounded(tmp_path):
    """`doctor --nodes --image` makes the root agent run the container runtime: at most 4 such
    lookups run at once, over all links; a fifth request is answered at once, "not checked",
    instead of starting a fifth process. The runtime here is a stand-in `podman` that records
    its start and sleeps."""
    fakebin = tmp_path / "bin"
    fakebin.mkdir()
    started = tmp_path / "started"
    started.mkdir()
    podman = fakebin / "podman"
    podman.write_text(f"#!/bin/sh\ntouch '{started}'/$$\nexec sleep 60\n")
    podman.chmod(0o755)
    env = {**os.environ, "PATH": f"{fakebin}:{os.environ['PATH']}"}
    d = Daemon(tmp_path, patient_agent_argv, "agent.log", env=env)
    links = []
    try:
        d.wait_listening()
        image = {"runtime": "podman", "image": "localhost/anything:1"}
        for _ in range(4):
            c = Client("127.0.0.1", d.port, "k1", d.secret, timeout=10)
            links.append(c)
            c.send("facts_request", image=image)
        wait_for(lambda: len(list(started.iterdir())) == 4, 20, "four lookups to be running")
        fifth = Client("127.0.0.1", d.port, "k1", d.secret, timeout=10)
        links.append(fifth)
        fifth.send("facts_request", image=image)
        while (m := fifth.receive())["type"] == "heartbeat":
            pass
        assert m["type"] == "facts", m
        err = m["facts"]["container_image"].get("error", "")
        assert "not checked: 4 image lookups are already running" in err, m
        time.sleep(0.5)  # a measuring window: a fifth runtime would have started by now
        assert len(list(started.iterdir())) == 4
        assert all(answers(c) for c in links[:4])  # the four lookups' links are still served
    finally:
        for c in links:
            c.close()
        d.stop()


def test_the_agent_raises_its_open_files_limit_to_the_hard_one(tmp_path):
    """The job's store on node rank 0 takes at most half the agent's open-files limit, and an
    agent started over SSH or srun keeps the login's soft limit (often 1024): it raises its own
    to the hard limit, as the service unit's LimitNOFILE gives it, so a large job's ranks are
    not refused."""
    agent = Daemon(tmp_path, agent_argv, "agent.log", nofile=(256, 4096))
    try:
        agent.wait_listening()
        with open(f"/proc/{agent.proc.pid}/limits") as f:
            line = next(l for l in f if l.startswith("Max open files"))
        assert line.split()[3:5] == ["4096", "4096"], line
    finally:
        agent.stop()
