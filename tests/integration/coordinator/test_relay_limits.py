"""The standing coordinator bounds what `ddpctl status|logs|stop|stacks --coordinator` may hold
(lib/coordinator/relay_limits.hpp): requests per user, and log files open for `logs` backlogs.
Started with a soft limit of 64 descriptors the daemon allows 8 requests per user and 4 backlog
files per user (an eighth and a sixteenth of them; a job raises the soft limit to the hard one,
128, which the bounds do not follow). A client past a bound is refused with the bound, only its
connection is dropped, and the others are served to the end. tests/integration/protoclient.py
plays the client that holds what ddpctl never would (connections kept open, replies unread)."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import protoclient  # noqa: E402
from ddptest import wait_for  # noqa: E402
from loopsite import LoopSite  # noqa: E402

NOFILE = (64, 128)
RANKS = 4
MIB_PER_RANK = 8  # 32 MiB of backlog: far more than the socket buffers and the relay's queue take

WORKER = r'''
import os, sys, time
rank = int(os.environ["RANK"])
mib, marks = int(sys.argv[1]), sys.argv[2]
chunk = "x" * 60000
for i in range(mib * 1024 * 1024 // 60000 + 1):
    print(f"bulk {i} {chunk}", flush=False)
print(f"bulk done rank {rank}", flush=True)
open(os.path.join(marks, f"done-{rank}"), "w").close()
time.sleep(600)
'''


@pytest.fixture
def site():
    s = LoopSite()
    try:
        yield s
    finally:
        s.close()


def client(site):
    key_id, secret = protoclient.read_token(site.token)
    return protoclient.Client("127.0.0.1", site.coord_port, key_id, secret, role="ctl", user="root", version=6,
                              timeout=60)


def control(site, request, job_id="big"):
    c = client(site)
    c.send("control", job_id=job_id, line=json.dumps(request) + "\n")
    return c


def start_job(site, mib=0):
    """Job "big": RANKS ranks that print `mib` MiB each, then "bulk done rank R", then sleep."""
    worker = site.dir / "worker.py"
    worker.write_text(WORKER)
    job = site.job("big", ["/usr/bin/python3", str(worker), str(mib), str(site.dir)], nproc=RANKS,
                   extra="stop: {grace: 2s}\n")
    r = site.submit(job, "--detach", "--job-id", "big", stdout=-1, stderr=-1, text=True)
    out, err = r.communicate(timeout=120)
    assert r.returncode == 0, err + site.logs()
    wait_for(lambda: all((site.dir / f"done-{r}").exists() for r in range(RANKS)), 120, "every rank's bulk printed")

    def relayed():  # the coordinator has every rank's last line (a logs request flushes its copy)
        r = site.ddpctl("logs", "big")
        return r.returncode == 0 and all(f"[{n}] bulk done rank {n}" in r.stdout for n in range(RANKS))

    wait_for(relayed, 120, "every rank's last line at the coordinator")


def drain(c):
    """Every control line of a request up to its eof: (header, lines)."""
    header, lines = None, []
    while True:
        m = c.receive()
        assert m["type"] == "control", m
        if "line" in m:
            j = json.loads(m["line"])
            if header is None:
                header = j
            else:
                lines.append(j)
        if m.get("eof"):
            return header, lines


def test_requests_per_user_are_bounded_and_the_others_go_on(site):
    site.start_agent()
    site.start_coordinator(nofile=NOFILE)
    start_job(site)
    held = []
    try:
        for i in range(8):
            c = control(site, {"op": "status"})
            header, _ = drain(c)  # answered; the connection is kept open, so is the relay
            assert header["ok"] and header["status"]["job_id"] == "big", header
            held.append(c)
        extra = control(site, {"op": "status"})
        answer = extra.receive()
        assert answer["type"] == "error" and answer["code"] == "bad_value", answer
        assert "user root has 8 status/logs/stop/stacks requests open on this coordinator, its limit per user" in \
            answer["message"], answer
        with pytest.raises(EOFError):
            extra.receive()  # dropped
        assert "its limit per user" in site.log("coordinator.log")
        # One of ours ends: a new request is served, and the job never noticed.
        held.pop().close()
        def served():
            c = control(site, {"op": "status"})
            m = c.receive()
            c.close()
            return m["type"] == "control" and json.loads(m["line"])["ok"]
        wait_for(served, 30, "a request served once one of the 8 ended")
        r = site.ddpctl("status", "--json", "big")
        assert r.returncode == 0 and json.loads(r.stdout)["job_id"] == "big", r.stderr
    finally:
        for c in held:
            c.close()
    assert site.coordinator.poll() is None


def test_backlog_files_per_user_are_bounded_and_the_reader_is_served_to_the_end(site):
    site.start_agent()
    site.start_coordinator(nofile=NOFILE)
    start_job(site, MIB_PER_RANK)
    # A reader that does not read: its backlog holds the 4 ranks' files open (the user's share).
    slow = control(site, {"op": "logs"})
    m = slow.receive()
    assert m["type"] == "control" and json.loads(m["line"])["ok"], m
    second = control(site, {"op": "logs"})
    answer = second.receive()
    assert answer["type"] == "error" and answer["code"] == "bad_value", answer
    assert ("job big's logs are 4 rank files, and this coordinator reads at most 4 at once for user root (4 open for "
            "other requests): name fewer ranks with --ranks, or let your other `ddpctl logs` finish") \
        == answer["message"], answer
    with pytest.raises(EOFError):
        second.receive()
    # The slow reader gets every line, to the end of every rank's bulk.
    _, lines = drain(slow)
    done = {l["line"] for l in lines if l["line"].startswith("bulk done")}
    assert done == {f"bulk done rank {r}" for r in range(RANKS)}, sorted(done)
    slow.close()
    # Its files closed: one rank's logs are readable at once.
    r = site.ddpctl("logs", "--ranks", "2", "big")
    assert r.returncode == 0, r.stderr
    assert "[2] bulk done rank 2" in r.stdout and "[1] " not in r.stdout
    r = site.ddpctl("stop", "big")
    assert r.returncode == 0, r.stderr
    assert site.coordinator.poll() is None
