"""Hostile peers on every listening port of a multi-node job (issue 5): the agent's port and,
while a job runs, node rank 0's store port. Garbage, an oversized frame header, a bogus hello,
and half-open connections (a partial frame, then silence) come from another simulated host;
the daemons keep serving: the job runs to its end, with the right exit status, and the agent
takes the next job. The hostile client runs inside a namespace of its own (the network rule)."""
import json
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

# Runs on the launcher's host: opens hostile connections to HOST:PORT for each port given, keeps
# the half-open ones until stdin closes, and reports what each connection saw.
HOSTILE = r'''
import json, socket, struct, sys, time
host, ports = sys.argv[1], [int(p) for p in sys.argv[2:]]
hello = json.dumps({"type": "hello", "v": 3, "versions": [3], "key_id": "default", "nonce": "00" * 32,
                    "role": "coordinator", "user": "mallory"}).encode()
attacks = {
    "garbage": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(range(256)) * 8,
    "oversized": struct.pack(">I", 0x7FFFFFF0) + b"{" * 64,
    "bogus-hello": struct.pack(">I", len(hello)) + hello,
    "half-open": struct.pack(">I", 1000) + b"{",
}
held, seen = [], {}
for port in ports:
    for name, data in attacks.items():
        s = socket.create_connection((host, port), timeout=5)
        s.sendall(data)
        if name == "half-open":
            held.append(s)
            continue
        s.settimeout(20)  # past the agent's 10 s handshake deadline: a hello without auth is dropped then
        got = b""
        try:
            while len(got) < 65536:
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
            seen[f"{port}/{name}"] = "closed"
        except socket.timeout:
            seen[f"{port}/{name}"] = "still open after 20 s"
        except ConnectionResetError:
            seen[f"{port}/{name}"] = "closed"
        s.close()
print(json.dumps(seen), flush=True)
sys.stdin.read()  # hold the half-open connections until told
'''

WORKER = r'''
import os, sys, time
# Rank 0 waits until the hostile client is done with the store port, then the job ends.
deadline = time.time() + 60
while not os.path.exists(sys.argv[1]) and time.time() < deadline:
    time.sleep(0.05)
print("RANK", os.environ["RANK"], "done", flush=True)
'''


@pytest.fixture
def cluster():
    with simcluster.Cluster(nodes=2) as c:
        yield c


def test_garbage_oversized_and_half_open_peers_leave_the_daemons_serving(cluster):
    c = cluster
    for h in c.hosts:
        c.start_agent(h)
    n1 = c.hosts[0]
    hostile = c.write("hostile.py", HOSTILE)
    flag = os.path.join(c.dir, "hostile-done")
    worker = c.write("wait.py", WORKER)
    job = c.write("wait.yaml", f"name: wait\nnproc_per_node: 1\ncommand: [{PY}, {worker}, {flag}]\n"
                               "store: {port: 29500}\nstop: {grace: 3s}\n")
    p = c.launch(job)
    # Wait for the job's store to listen on node rank 0, then attack both of n1's ports.
    deadline = time.time() + 60
    while time.time() < deadline and not n1.run(["ss", "-ltnH", "sport = :29500"]).stdout.strip():
        time.sleep(0.05)
    attacker = c.ctl.popen([PY, hostile, n1.addr, str(simcluster.AGENT_PORT), "29500"], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)
    seen = json.loads(attacker.stdout.readline())
    open(flag, "w").close()
    out, err = p.communicate(timeout=120)
    attacker.stdin.close()
    attacker.wait(timeout=30)
    assert p.returncode == 0, out + err
    assert "RANK 0 done" in out and "RANK 1 done" in out, out
    # Every hostile connection that was not held open was closed by the daemon, not left hanging.
    assert set(seen.values()) == {"closed"}, seen
    assert len(seen) == 6, seen
    # The agent logged the drops and still takes the next job.
    log = c.agent_log(n1)
    assert "oversized" in log or "limit" in log or "frame" in log, log[-3000:]
    open(flag, "w").close()
    p2 = c.launch(job)
    out2, err2 = p2.communicate(timeout=120)
    assert p2.returncode == 0, out2 + err2
