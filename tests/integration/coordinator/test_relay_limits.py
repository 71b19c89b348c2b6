"""The standing coordinator bounds what its clients may hold (lib/coordinator/relay_limits.hpp):
`ddpctl status|logs|stop|stacks --coordinator` requests per user, log files open for `logs`
backlogs, jobs and connections. Started with a soft limit of 64 descriptors the daemon allows 8
requests per user, 4 backlog files per user, 1 job per user and 16 connections (an eighth, a
sixteenth, a quarter of a sixteenth, a quarter of them; a job raises the soft limit to the hard
one, 128, which the bounds do not follow). A client past a bound is refused with the bound, only its
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


def test_jobs_per_user_are_bounded_and_the_running_one_goes_on(site):
    # 64 descriptors: 4 jobs at once, 1 per user (a sixteenth, and a quarter of that).
    site.start_agent()
    site.start_coordinator(nofile=NOFILE)
    start_job(site)
    second = site.job("second", ["/bin/true"])
    r = site.submit(second, "--detach", "--job-id", "second", stdout=-1, stderr=-1, text=True)
    out, err = r.communicate(timeout=120)
    assert r.returncode != 0, out
    assert ("user root has 1 job running on this coordinator, its limit per user: wait for one to end, or stop one "
            "(`ddpctl stop --coordinator ... JOB`)") in err, err
    assert "its limit per user" in site.log("coordinator.log")
    r = site.ddpctl("status", "--json", "big")
    assert r.returncode == 0 and json.loads(r.stdout)["job_id"] == "big", r.stderr
    # Once it has ended, the user may submit again.
    r = site.ddpctl("stop", "big")
    assert r.returncode == 0, r.stderr

    def submitted():
        r = site.submit(second, "--detach", "--job-id", "second", stdout=-1, stderr=-1, text=True)
        _, err = r.communicate(timeout=120)
        if r.returncode != 0 and "its limit per user" not in err:
            pytest.fail(err)  # refused for another reason than the bound
        return r.returncode == 0

    wait_for(submitted, 60, "a job accepted once the first ended")
    assert site.coordinator.poll() is None


def test_connections_per_user_are_bounded_and_the_others_stay(site):
    # 64 descriptors: 16 authenticated connections (a quarter), all of them one user's at most.
    site.start_agent()
    site.start_coordinator(nofile=NOFILE)
    held = [client(site) for _ in range(16)]
    try:
        extra = client(site)
        answer = extra.receive()
        assert answer["type"] == "error" and answer["code"] == "bad_value", answer
        assert answer["message"].startswith(
            "user root has 16 connections open to this coordinator, its limit per user"), answer
        with pytest.raises(EOFError):
            extra.receive()
        # The 16 are still served: each gets an answer to a request.
        for c in held[:2]:
            c.send("control", line=json.dumps({"op": "status"}) + "\n")
            m = c.receive()
            assert m["type"] == "control" and "no job of yours runs on this coordinator" in m["line"], m
        held.pop().close()
        held.pop().close()

        def admitted():
            c = client(site)
            c.send("control", line=json.dumps({"op": "status"}) + "\n")
            m = c.receive()
            c.close()
            return m["type"] == "control"

        wait_for(admitted, 30, "a connection admitted once others closed")
    finally:
        for c in held:
            c.close()
    assert site.coordinator.poll() is None
