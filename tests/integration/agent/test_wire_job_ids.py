"""Job ids that could leave the log directory, said on the wire by an authenticated peer (which
ddpctl itself never sends: it checks --job-id first). The agent makes <log_dir>/<job id> and the
standing coordinator <log_dir>/<job id> and a control socket, as root, so both refuse such an id
before anything touches the disk, drop that peer, and go on serving the next one. The peer is
tests/integration/protoclient.py, a second implementation of the protocol's client side.
Everything runs on loopback in the root namespace."""
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

import protoclient
from ddptest import BINARY_DIR, DDPCTL, free_port, write_job, write_token, wait_listening

AGENTD = str(BINARY_DIR / "bin" / "ddp-agentd")
COORDINATOR = str(BINARY_DIR / "bin" / "ddp-coordinator")
BAD_IDS = ["../x", "a/b", "..", "/abs"]



@pytest.fixture
def daemon(tmp_path):
    started = []

    def start(argv, port):
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path)), cwd=tmp_path)
        started.append(p)
        wait_listening(port, p)
        return p

    yield tmp_path, start
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)


def refused(port, token, role, type_, fields):
    """What the daemon answers to one message from an authenticated peer, and whether it then closed."""
    key_id, secret = protoclient.read_token(token)
    c = protoclient.Client("127.0.0.1", port, key_id, secret, role=role, user="root")
    try:
        c.send(type_, **fields)
        answer = c.receive()
        try:
            c.receive()
            closed = False
        except EOFError:
            closed = True
        return answer, closed
    finally:
        c.close()


def nothing_outside(tmp: Path, log_dir: Path):
    """No 'x', 'a' or 'abs' anywhere the ids point, and nothing in the log directory."""
    for p in (tmp / "x", tmp / "a", Path("/abs"), log_dir.parent / "x"):
        assert not p.exists(), p
    assert not log_dir.exists() or os.listdir(log_dir) == [], os.listdir(log_dir)


def test_agent_refuses_an_offer_whose_job_id_leaves_its_log_dir(daemon):
    tmp, start = daemon
    token, port, logs = write_token(tmp / "token"), free_port(), tmp / "agent-logs"
    agent = start([AGENTD, "--listen", f"127.0.0.1:{port}", "--token-file", str(token), "--log-dir", str(logs)], port)
    spec = {"file": "j.yaml", "name": "j", "nnodes_min": 1, "nnodes_max": 1, "nproc": {"kind": "count", "count": 1},
            "command": ["/bin/true"], "shell": False, "env": [], "env_forward": [], "max_restarts": 0,
            "restart_backoff_ms": 1000, "log_dir": str(logs), "log_max_bytes": 1 << 20, "store_port": 29500,
            "nccl_unique_id": "off", "stop_grace_ms": 1000, "forward_env": {},
            "binding": {"gpu": "auto", "numa": "auto", "nic": "auto"}}
    for bad in BAD_IDS:
        answer, closed = refused(port, token, "coordinator", "job_offer",
                                 {"t0_us": 1, "job_id": bad, "user": "root", "node": "n1", "spec": spec})
        assert answer["type"] == "error" and answer["code"] == "bad_value", answer
        assert "job_offer.job_id: expected" in answer["message"] and repr(bad) in answer["message"], answer
        assert closed
    nothing_outside(tmp, logs)
    assert agent.poll() is None
    # ... and the agent runs the next, honest job.
    job = write_job(tmp, "name: after\nnproc_per_node: 1\ncommand: [/bin/true]\nstore: {port: 0}\n")
    r = subprocess.run([DDPCTL, "launch", "--nodes", f"127.0.0.1:{port}", "--token-file", str(token), str(job)],
                       capture_output=True, text=True, timeout=120, cwd=tmp)
    assert r.returncode == 0, r.stderr


def test_standing_coordinator_refuses_a_submit_whose_job_id_leaves_its_log_dir(daemon):
    tmp, start = daemon
    token, port, logs = write_token(tmp / "token"), free_port(), tmp / "coord-logs"
    coord = start([COORDINATOR, "--listen", f"127.0.0.1:{port}", "--token-file", str(token), "--log-dir", str(logs)],
                  port)
    for bad in BAD_IDS:
        answer, closed = refused(port, token, "ctl", "submit",
                                 {"job_id": bad, "user": "root", "spec": {}, "nodes": ["127.0.0.1:1"]})
        assert answer["type"] == "error" and answer["code"] == "bad_value", answer
        assert "submit.job_id: expected" in answer["message"] and repr(bad) in answer["message"], answer
        assert closed
    nothing_outside(tmp, logs)
    assert coord.poll() is None
