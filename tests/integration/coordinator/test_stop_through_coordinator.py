"""The stop sequence and forwarded signals through a standing coordinator, as with a local or a
--nodes launch (multinode/test_stop_nodes.py, launch/test_stop_sequence.py): the submitter's
Ctrl-C reaches the ranks as SIGINT first (the stop_job's signal, protocol version 6), then
SIGTERM, then SIGKILL, each step said on the submitter's terminal; its SIGUSR1 reaches every
rank (signal_job, version 6) and a rank it kills for lack of a handler is named as forwarded.
Before, the coordinator stopped a submitter's Ctrl-C with SIGTERM
and a SIGUSR1 killed the submitting ddpctl, the job going on without it."""
import json
import os
import signal
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "multinode"))
from loopsite import running_site  # noqa: E402
from simcluster import finish, wait_for_tagged  # noqa: E402
from stop_worker import WORKER  # noqa: E402


@pytest.fixture
def site():
    with running_site() as s:
        yield s


def start(site, name, mode, ranks=2):
    worker = site.dir / "worker.py"
    worker.write_text(WORKER)
    job = site.job(name, ["/usr/bin/python3", str(worker), str(site.dir), mode], nproc=ranks,
                   extra="stop: {grace: 3s}\n")
    p = site.submit(job, "--job-id", name, "--result-json", str(site.dir / "r.json"), stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, text=True)
    return p, wait_for_tagged(p, ranks, "READY ")


def result(site):
    return json.loads((site.dir / "r.json").read_text())


def test_ctrl_c_reaches_the_ranks_as_keyboard_interrupt(site):
    p, _ = start(site, "ckpt", "checkpoint")
    os.kill(p.pid, signal.SIGINT)
    rc, out, err = finish(p, timeout=60)
    assert rc == 128 + signal.SIGINT, err + site.logs()
    for r in range(2):
        assert (site.dir / f"ckpt-{r}.pt").read_text() == f"rank {r} step 42", err
    assert err.count("Ctrl-C: sending SIGINT to 2 ranks on 1 node (KeyboardInterrupt); SIGTERM in 3s, SIGKILL 3s "
                     "after that; Ctrl-C again to kill now") == 1, err
    res = result(site)
    assert res["status"] == "stopped" and res["attempts"][0]["first_failure"] is None, res


def test_ranks_ignoring_sigint_get_sigterm_then_sigkill_each_step_said(site):
    p, _ = start(site, "stubborn", "stubborn")
    os.kill(p.pid, signal.SIGINT)
    rc, out, err = finish(p, timeout=90)
    assert rc == 128 + signal.SIGINT, err + site.logs()
    for r in range(2):
        assert (site.dir / f"signals-{r}").read_text() == "INT\nTERM\n", err
    steps = [
        "Ctrl-C: sending SIGINT to 2 ranks on 1 node (KeyboardInterrupt); SIGTERM in 3s, SIGKILL 3s after that; "
        "Ctrl-C again to kill now",
        "2 ranks still running 3s after SIGINT: the agents send SIGTERM; SIGKILL 3s after that",
        "2 ranks were still running after the 3s stop grace: SIGKILL",
    ]
    at = [err.find(s) for s in steps]
    assert all(i >= 0 for i in at) and at == sorted(at), err
    assert all(err.count(s) == 1 for s in steps), err
    assert result(site)["status"] == "stopped"


# SIGQUIT (Ctrl-\) stops the job as SIGTERM does (its default would dump the submitter's core
# and leave the job running with nobody watching); the status is the job's: stopped by SIGTERM.
# (SIGHUP, a closed terminal, leaves the job running on the coordinator: docs/multinode.md.)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGQUIT], ids=lambda s: s.name)
def test_sigterm_to_the_submitter_stops_at_sigterm(site, sig):
    p, _ = start(site, sig.name.lower()[3:], "stubborn")
    os.kill(p.pid, sig)
    rc, out, err = finish(p, timeout=90)
    assert rc == 128 + signal.SIGTERM, err + site.logs()
    for r in range(2):
        assert (site.dir / f"signals-{r}").read_text() == "TERM\n", err
    assert "sending SIGINT" not in err, err


def test_a_forwarded_sigusr1_reaches_every_rank(site):
    # Two ranks on one node: rank 0 dies of the forwarded SIGUSR1, so the agent stops rank 1 with
    # its own SIGTERM before the coordinator's stop; that rank is no first failure either (the
    # agent says its exit came after its stop signals: worker_exited's after_stop).
    p, _ = start(site, "usr1", "usr1-on-1")
    os.kill(p.pid, signal.SIGUSR1)
    rc, out, err = finish(p, timeout=60)
    assert rc == 1, err + site.logs()
    assert "SIGUSR1: passing it to every worker on 1 node" in err, err
    assert "rank 0 was killed by SIGUSR1, which ddpctl forwarded (it has no handler for it)" in err, err
    assert (site.dir / "signals-1").read_text() == "USR1\n"
    by_rank = {e["rank"]: e for e in result(site)["attempts"][0]["exits"]}
    assert by_rank[0]["forwarded"] and not by_rank[1]["forwarded"], by_rank
    assert result(site)["attempts"][0]["first_failure"] is None, result(site)
    assert "first failure" not in err, err
