"""ddp-agentd as a service: its config file (/etc/ddpctl/agent.yaml's format) and systemd's
readiness protocol, seen from a NOTIFY_SOCKET listener in systemd's place (systemd is not PID 1
on these machines). Everything runs on loopback in the root namespace."""
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from ddptest import BINARY_DIR, free_port, write_job, write_token

AGENTD = str(BINARY_DIR / "bin" / "ddp-agentd")
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
def env(tmp_path):
    listener = NotifyListener(tmp_path / "notify.sock")
    agents = []

    def start(*args, watchdog_usec=None):
        e = dict(os.environ, NOTIFY_SOCKET=str(listener.path))
        if watchdog_usec:
            e["WATCHDOG_USEC"] = str(watchdog_usec)
        p = subprocess.Popen([AGENTD, "--token-file", str(token), "--log-dir", str(tmp_path / "agent-logs"), *args],
                             env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        agents.append(p)
        return p

    token = write_token(tmp_path / "token")
    yield tmp_path, token, listener, start
    for p in agents:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)
    listener.close()


def stop(p):
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=60)
    return p.returncode, out


def test_config_file_is_read_and_a_flag_wins_over_it(env):
    tmp, token, listener, start = env
    port_file, port_flag = free_port(), free_port()
    cfg = tmp / "agent.yaml"
    cfg.write_text(f'listen: "127.0.0.1:{port_file}"\nname: from-config\nheartbeat_timeout: 8s\n')

    p = start("--config", str(cfg))
    ready = listener.wait_for("READY", "1")
    assert f"127.0.0.1:{port_file}" in ready["STATUS"]
    rc, out = stop(p)
    assert rc == 0 and "ddp-agentd from-config listening" in out, out

    p = start("--config", str(cfg), "--listen", f"127.0.0.1:{port_flag}", "--name", "from-flag")
    listener.messages.clear()
    ready = listener.wait_for("READY", "1")
    assert f"127.0.0.1:{port_flag}" in ready["STATUS"]
    rc, out = stop(p)
    assert rc == 0 and "ddp-agentd from-flag listening" in out, out


def test_bad_config_names_file_line_and_column_and_nothing_listens(env):
    tmp, token, listener, start = env
    cfg = tmp / "agent.yaml"
    cfg.write_text('name: n1\nlisten: "127.0.0.1:1"\ncontainer_runtime: lxc\nlog_dri: /x\n')
    p = start("--config", str(cfg))
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 2
    assert f"{cfg}:3:20: error: container_runtime: expected podman, docker or none, got 'lxc'" in out, out
    assert f"{cfg}:4:1: error: unknown key 'log_dri' (did you mean 'log_dir'?)" in out, out
    assert listener.messages == []

    p = start("--config", str(tmp / "missing.yaml"))
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 2 and "missing.yaml: error: cannot read the agent config" in out, out


def run_job(tmp, token, port, name, command):
    job = write_job(tmp, f"name: {name}\ncommand: {command}\nstore: {{port: {free_port()}}}\n", name=f"{name}.yaml")
    return subprocess.run([DDPCTL, "launch", "--nodes", f"127.0.0.1:{port}", "--token-file", str(token), str(job)],
                          cwd=tmp, capture_output=True, text=True, timeout=120)


def test_notify_ready_status_watchdog_and_stopping(env):
    tmp, token, listener, start = env
    port = free_port()
    watchdog_usec = 2_000_000
    p = start("--listen", f"127.0.0.1:{port}", watchdog_usec=watchdog_usec)
    ready = listener.wait_for("READY", "1")
    assert ready["STATUS"].startswith("idle")

    # Pings come at half of WATCHDOG_USEC: over a 6 s window systemd needs at least 3 (one per
    # 2 s) to keep the service; expect clearly more than that, without timing each one.
    start_t = time.monotonic()
    while time.monotonic() - start_t < 6:
        listener.receive(6 - (time.monotonic() - start_t))
    pings = [t for t, f in listener.messages if f.get("WATCHDOG") == "1" and t >= start_t]
    assert len(pings) >= 4, listener.messages

    r = run_job(tmp, token, port, "notified", "[/bin/sleep, '1']")
    assert r.returncode == 0, r.stderr
    listener.wait_for("STATUS", "running job notified-")
    # After the job: idle again.
    running_at = max(i for i, (_, f) in enumerate(listener.messages) if "running job" in f.get("STATUS", ""))
    while not any(f.get("STATUS", "").startswith("idle") for _, f in listener.messages[running_at:]):
        assert listener.receive(30) is not None, listener.messages

    rc, out = stop(p)
    assert rc == 0, out
    stopping = listener.wait_for("STOPPING", "1", timeout=5)
    assert "SIGTERM" in stopping["STATUS"]


def test_no_watchdog_pings_when_the_unit_sets_none(env):
    tmp, token, listener, start = env
    p = start("--listen", f"127.0.0.1:{free_port()}")
    listener.wait_for("READY", "1")
    t0 = time.monotonic()
    while time.monotonic() - t0 < 2:
        listener.receive(2 - (time.monotonic() - t0))
    assert not any("WATCHDOG" in f for _, f in listener.messages), listener.messages
    stop(p)


def test_allowed_users_refuses_other_submitters(env):
    tmp, token, listener, start = env
    port = free_port()
    cfg = tmp / "agent.yaml"
    cfg.write_text(f'listen: "127.0.0.1:{port}"\nallowed_users: [someone-else]\n')
    p = start("--config", str(cfg))
    listener.wait_for("READY", "1")
    marker = tmp / "ran"
    r = run_job(tmp, token, port, "refused", f"[/usr/bin/touch, '{marker}']")
    assert r.returncode != 0
    assert "does not accept jobs from user" in r.stderr and "allowed_users" in r.stderr, r.stderr
    assert not marker.exists()
    rc, out = stop(p)
    assert "not in allowed_users; refused" in out, out
