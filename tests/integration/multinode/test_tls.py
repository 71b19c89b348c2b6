"""TLS under the protocol across simulated hosts (issue 5): `ddpctl launch --tls` to one agent
that requires TLS and one that merely allows it; a plaintext launch to the one that requires it
is refused with a message that names --tls; and what an eavesdropper on a node's link sees,
captured from that node's own interface (an AF_PACKET socket inside its namespace): the job's
command line in clear without TLS (the control that shows the capture works), nowhere with it.
"""
import os
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import simcluster  # noqa: E402
from simcluster import LINE, finish, job_file  # noqa: E402
job = job_file  # nproc 1, no extra lines

SKIP = simcluster.netns_unavailable()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

PY = "/usr/bin/python3"

WORKER = r'''
import os, sys
print("RANK " + os.environ["RANK"] + " " + sys.argv[1], flush=True)
'''

# Records every frame on eth0 until the stop file appears (bounded), as a node-side tap would.
SNIFFER = r'''
import os, socket, sys, time
out, stop = sys.argv[1], sys.argv[2]
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
s.bind(("eth0", 0))
s.settimeout(0.2)
open(out + ".ready", "w").close()
deadline = time.time() + 120
with open(out, "wb") as f:
    while not os.path.exists(stop) and time.time() < deadline:
        try:
            f.write(s.recv(65535))
        except socket.timeout:
            pass
'''


@pytest.fixture
def cluster():
    with simcluster.Cluster(nodes=2) as c:
        yield c


def ranks(out):
    return sorted(int(m["rank"]) for m in map(LINE.match, out.splitlines()) if m and m["text"].startswith("RANK "))


def captured(c, host, run):
    """Runs run() while host's eth0 is captured; returns (run's result, the captured bytes)."""
    out = os.path.join(c.dir, f"capture-{host.name}-{time.monotonic_ns()}")
    stop = out + ".stop"
    sniffer = c.write("sniffer.py", SNIFFER)
    p = subprocess.Popen(["ip", "netns", "exec", host.ns, PY, sniffer, out, stop])
    c.procs.append(p)
    deadline = time.time() + 20
    while not os.path.exists(out + ".ready") and time.time() < deadline:
        time.sleep(0.05)
    assert os.path.exists(out + ".ready"), "the capture did not start"
    try:
        result = run()
    finally:
        open(stop, "w").close()
        p.wait(timeout=30)
    with open(out, "rb") as f:
        return result, f.read()


def test_tls_launch_hides_the_job_from_the_wire_and_plaintext_shows_it(cluster):
    c = cluster
    n1, n2 = c.hosts
    c.start_agent(n1, extra=("--tls", "required"))
    c.start_agent(n2)  # tls: allowed, the default
    worker = c.write("worker.py", WORKER)
    marker = "marker-" + os.urandom(8).hex()
    spec = job(c, "tls", [PY, worker, marker])

    # Without TLS on n2 alone (it allows plaintext): the command line, and so the marker, crosses in clear.
    (rc, out, err), wire = captured(c, n2, lambda: finish(c.launch(spec, hosts=[n2])))
    assert rc == 0, out + err
    assert ranks(out) == [0]
    assert marker.encode() in wire, "the capture saw no plaintext job: it would prove nothing below"

    # With --tls on both: the job runs everywhere, and the marker is nowhere on n2's link.
    (rc, out, err), wire = captured(c, n2, lambda: finish(c.launch(spec, "--tls")))
    assert rc == 0, out + err
    assert ranks(out) == [0, 1], out + err
    assert out.count(marker) == 2, out  # the workers did get it, and their output came back
    assert len(wire) > 2000, "nothing captured"
    assert marker.encode() not in wire
    for h in (n1, n2):
        assert "inside TLS 1.3" in c.agent_log(h), c.agent_log(h)


def test_agent_requiring_tls_refuses_a_plaintext_launch_and_says_how(cluster):
    c = cluster
    n1, _ = c.hosts
    c.start_agent(n1, extra=("--tls", "required"))
    worker = c.write("worker.py", WORKER)
    rc, out, err = finish(c.launch(job(c, "plain", [PY, worker, "x"]), hosts=[n1]), timeout=60)
    assert rc == 2, out + err
    assert "only TLS" in err and "--tls" in err, err
    assert ranks(out) == []
    # A wrong secret under TLS is refused by TLS itself, and the agent serves on.
    other = c.write_token("other-token")
    rc, out, err = finish(c.launch(job(c, "wrong", [PY, worker, "x"]), "--tls", token=other, hosts=[n1]), timeout=60)
    assert rc == 2, out + err
    assert "TLS handshake failed" in err, err
    rc, out, err = finish(c.launch(job(c, "right", [PY, worker, "x"]), "--tls", hosts=[n1]), timeout=60)
    assert rc == 0, out + err
    assert ranks(out) == [0]
