"""A replayed handshake and a frame injected after authentication (issue 5). A relay on the
launcher's host sits between ddpctl and n1's agent, as a man in the middle would:
  - record: the job runs through it, and it keeps what ddpctl sent; replayed byte for byte on a
    new connection, the agent answers with a fresh nonce, the recorded proof fails, and nothing runs;
  - inject: once ddpctl's offer has gone through, it sends that frame again (correctly MACed, but
    out of sequence); the agent drops the connection, and nothing runs.
The relay and the replaying client run in the launcher's namespace (the network rule)."""
import os
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import simcluster  # noqa: E402

SKIP = simcluster.netns_unavailable()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

PY = "/usr/bin/python3"
RELAY = r'''
import select, socket, struct, sys
listen_host, listen_port, up_host, up_port, mode, record = sys.argv[1:7]
srv = socket.create_server((listen_host, int(listen_port)))
print("ready", flush=True)
c, _ = srv.accept()
u = socket.create_connection((up_host, int(up_port)))
buf, frames, sent_frames, injected = b"", [], 0, False
rec = open(record, "wb")
while True:
    r, _, _ = select.select([c, u], [], [], 60)
    if not r:
        break
    if c in r:
        data = c.recv(65536)
        if not data:
            break
        rec.write(data); rec.flush()
        u.sendall(data)
        buf += data
        while len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">I", buf[:4])[0]:
            n = 4 + struct.unpack(">I", buf[:4])[0]
            frames.append(buf[:n]); buf = buf[n:]
        # handshake: hello, auth; then job_offer (session frame #0): send it again as #1
        if mode == "inject" and not injected and len(frames) >= 3:
            u.sendall(frames[-1])
            injected = True
    if u in r:
        data = u.recv(65536)
        if not data:
            break
        c.sendall(data)
'''
REPLAY = r'''
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=15)
s.sendall(open(sys.argv[3], "rb").read())
got = b""
try:
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
except (socket.timeout, ConnectionResetError):
    pass
print(got.decode("utf-8", "replace"))
'''
WORKER = "import os, sys; open(os.path.join(sys.argv[1], 'ran-' + os.environ['RANK']), 'w').close()\n"


@pytest.fixture
def cluster():
    with simcluster.Cluster(nodes=1) as c:
        yield c


def through_relay(c, mode, tag):
    n1 = c.hosts[0]
    marks = os.path.join(c.dir, f"marks-{tag}")
    os.makedirs(marks)
    relay = c.write("relay.py", RELAY)
    record = os.path.join(c.dir, f"record-{tag}.bin")
    r = c.ctl.popen([PY, relay, c.ctl.addr, "29999", n1.addr, str(simcluster.AGENT_PORT), mode, record],
                    stdout=subprocess.PIPE, text=True)
    assert r.stdout.readline().strip() == "ready"
    worker = c.write("mark.py", WORKER)
    job = c.write(f"{tag}.yaml", f"name: {tag}\nnproc_per_node: 1\ncommand: [{PY}, {worker}, {marks}]\n"
                                 "store: {port: 29500}\nrendezvous: {join_timeout: 8s}\n")
    argv = [os.path.join(c.bin, "ddpctl"), "launch", "--nodes", f"{c.ctl.addr}:29999", "--token-file", c.token, job]
    p = c.ctl.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=c.dir)
    return p, marks, record, job


def test_replayed_handshake_is_refused_and_nothing_runs(cluster):
    c = cluster
    n1 = c.hosts[0]
    c.start_agent(n1)
    p, marks, record, _ = through_relay(c, "record", "rec")
    out, err = p.communicate(timeout=90)
    assert p.returncode == 0, out + err
    assert os.listdir(marks) == ["ran-0"]  # the recorded job itself ran
    os.remove(os.path.join(marks, "ran-0"))
    replay = c.write("replay.py", REPLAY)
    r = c.ctl.run([PY, replay, n1.addr, str(simcluster.AGENT_PORT), record], timeout=60)
    assert '"hello_ack"' in r.stdout and '"error"' in r.stdout, r.stdout  # answered, then refused
    time.sleep(1)
    assert os.listdir(marks) == [], "a replayed handshake started workers"
    log = c.agent_log(n1)
    assert "auth" in log.lower(), log[-2000:]
    # ... and the agent still serves an honest coordinator.
    p2 = c.launch(c.write("after.yaml", "name: after\nnproc_per_node: 1\ncommand: [/bin/true]\nstore: {port: 29500}\n"))
    out2, err2 = p2.communicate(timeout=90)
    assert p2.returncode == 0, out2 + err2


def test_frame_injected_after_auth_drops_the_link_and_nothing_runs(cluster):
    c = cluster
    n1 = c.hosts[0]
    c.start_agent(n1)
    p, marks, _, _ = through_relay(c, "inject", "inj")
    # Depending on timing ddpctl sees the node lost after its join, or redials it until the join
    # timeout (the relay takes one connection only); either way the job fails.
    out, err = p.communicate(timeout=60)
    assert p.returncode != 0, out + err
    assert os.listdir(marks) == [], "workers ran after an injected frame"
    log = c.agent_log(n1)
    assert "bad_mac: frame #1 failed authentication" in log, log[-2000:]
