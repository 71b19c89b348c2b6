"""ddp-coordinator as a service: systemd's readiness protocol seen from a NOTIFY_SOCKET listener in
systemd's place (systemd is not PID 1 on these machines), and its refusals. Loopback only; the
jobs it runs are tested on simulated hosts (multinode/test_coordinator.py)."""
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from ddptest import BINARY_DIR, free_port, write_token

COORDINATOR = str(BINARY_DIR / "bin" / "ddp-coordinator")
DDPCTL = str(BINARY_DIR / "bin" / "ddpctl")


class NotifyListener:
    """An AF_UNIX datagram socket where systemd's would be; collects (time, fields) messages."""

    def __init__(self, path: Path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.path = path
        self.messages = []

    def wait_for(self, key, value_part="", timeout=30.0):
        deadline = time.monotonic() + timeout
        for t, fields in self.messages:
            if key in fields and value_part in fields[key]:
                return fields
        while time.monotonic() < deadline:
            fields = self.receive(deadline - time.monotonic())
            if fields is not None and key in fields and value_part in fields[key]:
                return fields
        raise AssertionError(f"no {key} containing {value_part!r} within {timeout}s; got {self.messages}")

    def receive(self, timeout):
        self.sock.settimeout(max(timeout, 0.01))
        try:
            data = self.sock.recv(4096).decode()
        except socket.timeout:
            return None
        fields = dict(line.split("=", 1) for line in data.split("\n") if "=" in line)
        self.messages.append((time.monotonic(), fields))
        return fields

    def close(self):
        self.sock.close()


@pytest.fixture
def coordinator(tmp_path):
    listener = NotifyListener(tmp_path / "notify.sock")
    token = write_token(tmp_path / "token")
    port = free_port()
    e = dict(os.environ, NOTIFY_SOCKET=str(listener.path), WATCHDOG_USEC="2000000",
             XDG_RUNTIME_DIR=str(tmp_path))
    p = subprocess.Popen([COORDINATOR, "--listen", f"127.0.0.1:{port}", "--token-file", str(token), "--log-dir",
                          str(tmp_path / "logs")], env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    yield tmp_path, token, port, listener, p
    if p.poll() is None:
        p.kill()
    p.wait(timeout=30)
    listener.close()


def test_notify_ready_status_watchdog_and_stopping(coordinator):
    tmp, token, port, listener, p = coordinator
    ready = listener.wait_for("READY", "1")
    assert ready["STATUS"] == f"idle, listening on 127.0.0.1:{port}"
    # It keeps pinging (every second for WATCHDOG_USEC=2 s); how fast is not asserted on a loaded machine.
    deadline = time.monotonic() + 60
    while len([f for t, f in listener.messages if f.get("WATCHDOG") == "1"]) < 3 and time.monotonic() < deadline:
        listener.receive(deadline - time.monotonic())
    pings = [t for t, f in listener.messages if f.get("WATCHDOG") == "1"]
    assert len(pings) >= 3, listener.messages
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 0, out
    assert "SIGTERM" in listener.wait_for("STOPPING", "1")["STATUS"]


def test_wrong_token_and_strays_are_refused_and_it_keeps_serving(coordinator, tmp_path):
    tmp, token, port, listener, p = coordinator
    listener.wait_for("READY", "1")
    job = tmp / "job.yaml"
    job.write_text("name: j\nnproc_per_node: 1\ncommand: [/bin/true]\n")
    wrong = write_token(tmp / "wrong")
    r = subprocess.run([DDPCTL, "launch", "--coordinator", f"127.0.0.1:{port}", "--token-file", str(wrong), "--nodes",
                        "127.0.0.1:1", str(job)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "refused" in r.stderr, r.stderr
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        s.settimeout(10)
        while s.recv(4096):
            pass
    r = subprocess.run([DDPCTL, "status", "--coordinator", f"127.0.0.1:{port}", "--token-file", str(token)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "no job of yours runs on this coordinator" in r.stderr, r.stderr
    assert p.poll() is None


def test_job_id_that_could_leave_the_log_dir_is_a_usage_error(coordinator):
    tmp, token, port, listener, p = coordinator
    listener.wait_for("READY", "1")
    job = tmp / "job.yaml"
    job.write_text("name: j\nnproc_per_node: 1\ncommand: [/bin/true]\n")
    for bad in ("../x", "a/b", ".."):
        r = subprocess.run([DDPCTL, "launch", "--coordinator", f"127.0.0.1:{port}", "--token-file", str(token),
                            "--nodes", "127.0.0.1:1", "--job-id", bad, str(job)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and "--job-id: expected" in r.stderr, r.stderr
    assert not (tmp / "x").exists() and not (tmp / "a").exists()
    assert not (tmp / "logs").exists() or os.listdir(tmp / "logs") == []
    assert p.poll() is None
