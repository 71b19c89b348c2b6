"""TLS under the protocol across simulated hosts (issue 5): `ddpctl launch --tls` to one agent
that requires TLS and one that merely allows it; a plaintext launch to the one that requires it
is refused with a message that names --tls; and what an eavesdropper on a node's link sees,
captured from that node's own interface (an AF_PACKET socket inside its namespace): the job's
command line in clear without TLS (the control that shows the capture works), nowhere with it.
The same through a standing coordinator (`launch --coordinator --tls`): its link to ddpctl and
its links to the job's agents, captured on the coordinator's host.
"""
import os
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import simcluster  # noqa: E402
from simcluster import LINE, captured, finish, job_file  # noqa: E402
job = job_file  # nproc 1, no extra lines

SKIP = simcluster.netns_unavailable()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

PY = "/usr/bin/python3"

WORKER = r'''
import os, sys
print("RANK " + os.environ["RANK"] + " " + sys.argv[1], flush=True)
'''


@pytest.fixture
def cluster():
    with simcluster.Cluster(nodes=2) as c:
        yield c


def ranks(out):
    return sorted(int(m["rank"]) for m in map(LINE.match, out.splitlines()) if m and m["text"].startswith("RANK "))


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


COORD_PORT = 29411


def test_tls_through_a_standing_coordinator_hides_the_job_on_every_link(cluster3):
    c = cluster3
    n1, n2, co = c.hosts
    c.start_agent(n1, extra=("--tls", "required"))
    c.start_agent(n2)
    log = open(os.path.join(c.dir, "coordinator.log"), "ab")
    co.popen([os.path.join(c.bin, "ddp-coordinator"), "--listen", f"{co.addr}:{COORD_PORT}", "--token-file", c.token,
              "--log-dir", "/tmp/coord-logs"], stdout=log, stderr=subprocess.STDOUT)
    c.wait_listening(co, port=COORD_PORT)
    worker = c.write("worker.py", WORKER)
    marker = "marker-" + os.urandom(8).hex()
    spec = job(c, "viaco", [PY, worker, marker])

    def submit(*args, hosts):
        argv = [os.path.join(c.bin, "ddpctl"), "launch", "--coordinator", f"{co.addr}:{COORD_PORT}", "--nodes",
                c.nodes_arg(hosts), "--token-file", c.token, *args, spec]
        return finish(c.ctl.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=c.dir))

    # The control: in plaintext to n2 (which allows it), the marker crosses the coordinator's link.
    (rc, out, err), wire = captured(c, co, lambda: submit(hosts=[n2]))
    assert rc == 0, out + err
    assert marker.encode() in wire, "the capture saw no plaintext job: it would prove nothing below"
    # n1 takes only TLS: a plaintext submit fails there, saying so.
    rc, out, err = submit(hosts=[n1])
    assert rc != 0 and "only TLS" in out + err, out + err
    # --tls: ddpctl to the coordinator, and the coordinator to both agents.
    (rc, out, err), wire = captured(c, co, lambda: submit("--tls", hosts=[n1, n2]))
    assert rc == 0, out + err
    assert ranks(out) == [0, 1] and out.count(marker) == 2, out + err
    assert len(wire) > 2000, "nothing captured"
    assert marker.encode() not in wire
    # ddpctl status --coordinator --tls reaches it too (the relay's link): the job that just ended.
    r = c.ctl.run([os.path.join(c.bin, "ddpctl"), "status", "--coordinator", f"{co.addr}:{COORD_PORT}", "--token-file",
                   c.token, "--tls"], cwd=c.dir)
    assert r.returncode == 1 and "no job of yours is running; the last one: job " in r.stderr, r.stdout + r.stderr
    assert "(succeeded, exit code 0)" in r.stderr, r.stdout + r.stderr


@pytest.fixture
def cluster3():
    with simcluster.Cluster(nodes=3) as c:
        yield c
