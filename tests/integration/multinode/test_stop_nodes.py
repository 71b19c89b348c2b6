"""The stop sequence across simulated nodes (issue 25): a Ctrl-C to ddpctl reaches every node's
ranks as SIGINT first (the coordinator's stop carries the interrupt grace, protocol version 6),
then SIGTERM, then SIGKILL, each step said on the launcher's terminal; a SIGUSR1 that the agents
forward and that kills a rank with no handler is named as such in the report, and no rank is the
job's first failure."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import simcluster  # noqa: E402
from simcluster import finish, wait_for_tagged  # noqa: E402
from stop_worker import WORKER  # noqa: E402

SKIP = simcluster.netns_unavailable()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

PY = "/usr/bin/python3"


@pytest.fixture
def cluster():
    with simcluster.Cluster(nodes=3) as c:
        for h in c.hosts:
            c.start_agent(h)
        yield c


def start(c, name, mode):
    worker = c.write("worker.py", WORKER)
    job = simcluster.job_file(c, name, [PY, worker, c.dir, mode])  # one rank per node, stop.grace 3s
    p = c.launch(job, "--result-json", os.path.join(c.dir, "r.json"))
    return p, wait_for_tagged(p, 3, "READY ")


def result(c):
    with open(os.path.join(c.dir, "r.json")) as f:
        return json.load(f)


def test_ctrl_c_reaches_every_nodes_python_ranks_as_keyboard_interrupt(cluster):
    c = cluster
    p, _ = start(c, "ckpt", "checkpoint")
    os.kill(p.pid, signal.SIGINT)
    rc, out, err = finish(p, timeout=60)
    assert rc == 128 + signal.SIGINT, err
    for r in range(3):
        with open(os.path.join(c.dir, f"ckpt-{r}.pt")) as f:
            assert f.read() == f"rank {r} step 42", err
    assert err.count("Ctrl-C: sending SIGINT to 3 ranks on 3 nodes (KeyboardInterrupt); SIGTERM in 3s, SIGKILL 3s "
                     "after that; Ctrl-C again to kill now") == 1, err
    res = result(c)
    assert res["status"] == "stopped" and res["attempts"][0]["first_failure"] is None, res


def test_ranks_ignoring_sigint_get_sigterm_then_sigkill_each_step_said(cluster):
    c = cluster
    p, _ = start(c, "stubborn", "stubborn")
    os.kill(p.pid, signal.SIGINT)
    rc, out, err = finish(p, timeout=90)
    assert rc == 128 + signal.SIGINT, err
    for r in range(3):
        with open(os.path.join(c.dir, f"signals-{r}")) as f:
            assert f.read() == "INT\nTERM\n", err
    steps = [
        "Ctrl-C: sending SIGINT to 3 ranks on 3 nodes (KeyboardInterrupt); SIGTERM in 3s, SIGKILL 3s after that; "
        "Ctrl-C again to kill now",
        "3 ranks still running 3s after SIGINT: the agents send SIGTERM; SIGKILL 3s after that",
        "3 ranks were still running after the 3s stop grace: SIGKILL",
    ]
    at = [err.find(s) for s in steps]
    assert all(i >= 0 for i in at) and at == sorted(at), err
    assert all(err.count(s) == 1 for s in steps), err
    assert result(c)["status"] == "stopped"


def test_a_forwarded_sigusr1_is_named_and_no_rank_is_the_first_failure(cluster):
    c = cluster
    p, _ = start(c, "usr1", "usr1-on-1")
    os.kill(p.pid, signal.SIGUSR1)
    rc, out, err = finish(p, timeout=60)
    assert rc == 1, err
    assert "first failure" not in err, err
    assert "no rank failed by itself:" in err, err
    for r in (0, 2):
        assert f"rank {r} was killed by SIGUSR1, which ddpctl forwarded (it has no handler for it)" in err, err
    with open(os.path.join(c.dir, "signals-1")) as f:
        assert f.read() == "USR1\n"
    a = result(c)["attempts"][0]
    assert a["first_failure"] is None, a
    by_rank = {e["rank"]: e for e in a["exits"]}
    assert by_rank[0]["forwarded"] and by_rank[2]["forwarded"] and not by_rank[1]["forwarded"], a


def test_sigterm_to_every_process_of_the_job_leaves_the_stop_to_the_agent(cluster):
    """SLURM's scancel and systemd's control-group kill signal every process of a job at once:
    the ranks and their shepherd. The shepherd leaves the stop to its living agent instead of
    SIGKILLing the ranks while their SIGTERM handlers write a checkpoint (before: killed at once,
    no checkpoint; test_slurm_real.py saw it under a real scancel)."""
    c = cluster
    p, ready = start(c, "scancel", "slow-term")
    shepherds = set()
    for rank, (node, (pid, ppid)) in ready.items():
        with open(f"/proc/{ppid}/cmdline", "rb") as f:
            assert b"shepherd" in f.read(), (rank, node, ppid)
        shepherds.add(ppid)
    assert len(shepherds) == 3
    for rank, (node, (pid, ppid)) in ready.items():
        os.kill(ppid, signal.SIGTERM)
        os.kill(pid, signal.SIGTERM)
    rc, out, err = finish(p, timeout=60)
    for r in range(3):
        path = os.path.join(c.dir, f"ckpt-{r}.pt")
        assert os.path.exists(path), f"rank {r} was killed before its SIGTERM handler ended:\n{err}"
        with open(path) as f:
            assert f.read() == f"rank {r} on SIGTERM"
    assert rc == 0, err


def test_a_sigkilled_launchers_job_keeps_its_end_record(cluster):
    # ddpctl launch --nodes is SIGKILLed mid-run: the agents stop the ranks once they lose it, and
    # the attempt's guardian leaves the job's end record, so `ddpctl status|logs JOB` still know it.
    c = cluster
    worker = c.write("worker.py", WORKER)
    job = simcluster.job_file(c, "gone", [PY, worker, c.dir, "plain"])
    state = os.path.join(c.dir, "state")
    os.makedirs(state, mode=0o700)
    env = ["env", f"XDG_STATE_HOME={state}"]
    argv = [*env, os.path.join(c.bin, "ddpctl"), "launch", "--nodes", c.nodes_arg(), "--token-file", c.token,
            "--job-id", "gone-1", job]
    p = c.ctl.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=c.dir)
    wait_for_tagged(p, 3, "READY ")
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=10)
    ddpctl = [*env, os.path.join(c.bin, "ddpctl")]
    deadline = time.time() + 15
    while True:
        r = c.ctl.run([*ddpctl, "status", "--json", "gone-1"])
        if r.returncode == 1 and r.stdout.strip():
            break
        assert time.time() < deadline, f"no end record 15 s after the launcher died: {r.returncode} {r.stdout!r} {r.stderr!r}"
        time.sleep(0.1)
    record = json.loads(r.stdout)
    assert record["state"] == "ended" and record["status"] == "failed", (record, r.stderr)
    assert record["message"].startswith(f"ddpctl (pid {p.pid}) died while the job ran"), record
    r = c.ctl.run([*ddpctl, "logs", "--ranks", "2", "gone-1"])
    assert r.returncode == 0 and r.stdout.startswith("[2] READY "), (r.stdout[:300], r.stderr)
