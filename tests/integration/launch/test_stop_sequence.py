"""The stop sequence of a local launch (issue 25): Ctrl-C sends SIGINT to every rank first, so a
Python script gets KeyboardInterrupt and can save its checkpoint; SIGTERM follows the ranks left
after the interrupt grace (10 s, or stop.grace if shorter), SIGKILL stop.grace after that, each
step said once. Signals ddpctl forwards (SIGUSR1/2) that kill a rank with no handler are named as
such, and such a rank is never the job's first failure."""
import json
import signal

from ddptest import PYTHON, alive, read_pids, start_launch, wait_for, write_job


def py_job(tmp, script, nproc=2, grace="20s"):
    s = tmp / "worker.py"
    s.write_text(script)
    return write_job(tmp, f"nproc_per_node: {nproc}\ncommand: [{PYTHON}, {s}]\nstop: {{grace: {grace}}}\n")


# Saves a "checkpoint" on KeyboardInterrupt, as a training script's `except KeyboardInterrupt:` would.
CHECKPOINTING = """
import os, time
r = os.environ["RANK"]
try:  # the pid file inside: a SIGINT right after it must land where it is caught
    open(f"worker-{r}.pid", "w").write(str(os.getpid()))
    while True:
        time.sleep(1)
except KeyboardInterrupt:
    with open(f"ckpt-{r}.tmp", "w") as f:
        f.write(f"rank {r} step 42")
    os.rename(f"ckpt-{r}.tmp", f"ckpt-{r}.pt")
"""


def test_ctrl_c_gives_python_ranks_keyboard_interrupt_and_they_save_a_checkpoint(tmp_path):
    job = py_job(tmp_path, CHECKPOINTING)
    result = tmp_path / "r.json"
    p = start_launch(job, "--result-json", str(result))
    wait_for(lambda: len(list(tmp_path.glob("worker-*.pid"))) == 2, what="workers to start")
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGINT, err
    for r in (0, 1):
        assert (tmp_path / f"ckpt-{r}.pt").read_text() == f"rank {r} step 42", err
    assert err.count("Ctrl-C: sending SIGINT to 2 ranks (KeyboardInterrupt); SIGTERM in 10s, SIGKILL 20s after "
                     "that; Ctrl-C again to kill now") == 1, err
    assert "after SIGINT: sending SIGTERM" not in err, err  # nobody was left for it
    res = json.loads(result.read_text())
    assert res["status"] == "stopped" and res["attempts"][0]["first_failure"] is None, res
    for pid in read_pids(tmp_path, "worker-*.pid"):
        assert not alive(pid)


# Ignores SIGINT and SIGTERM, noting each (one line per signal, in order), so only SIGKILL ends it.
STUBBORN = """
import os, signal, time
r = os.environ["RANK"]
def note(name):
    def h(*_):
        with open(f"signals-{r}", "a") as f:
            f.write(name + "\\n")
    return h
signal.signal(signal.SIGINT, note("INT"))
signal.signal(signal.SIGTERM, note("TERM"))
open(f"worker-{r}.pid", "w").write(str(os.getpid()))
while True:
    time.sleep(1)
"""


def test_a_rank_ignoring_sigint_gets_sigterm_then_sigkill_and_each_step_is_said_once(tmp_path):
    job = py_job(tmp_path, STUBBORN, grace="2s")
    result = tmp_path / "r.json"
    p = start_launch(job, "--result-json", str(result))
    wait_for(lambda: len(list(tmp_path.glob("worker-*.pid"))) == 2, what="workers to start")
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGINT, err
    steps = [
        "Ctrl-C: sending SIGINT to 2 ranks (KeyboardInterrupt); SIGTERM in 2s, SIGKILL 2s after that; "
        "Ctrl-C again to kill now",
        "2 ranks still running 2s after SIGINT: sending SIGTERM; SIGKILL 2s after that",
        "still running after the 2s grace period: SIGKILL",
    ]
    at = [err.find(s) for s in steps]
    assert all(i >= 0 for i in at) and at == sorted(at), err
    assert all(err.count(s) == 1 for s in steps), err
    for r in (0, 1):
        assert (tmp_path / f"signals-{r}").read_text() == "INT\nTERM\n", err
    res = json.loads(result.read_text())
    assert res["status"] == "stopped", res
    assert all(e["signal"] == signal.SIGKILL for e in res["attempts"][0]["exits"]), res


def test_ddpctl_stop_keeps_sigterm_first(tmp_path):
    # Not a Ctrl-C: SIGTERM to ddpctl (as `ddpctl stop` and schedulers send it) starts at SIGTERM.
    job = py_job(tmp_path, STUBBORN, nproc=1, grace="1s")
    p = start_launch(job)
    wait_for(lambda: len(list(tmp_path.glob("worker-*.pid"))) == 1, what="the worker to start")
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, err
    assert (tmp_path / "signals-0").read_text() == "TERM\n", err
    assert "SIGINT" not in err, err


def test_a_rank_killed_by_a_forwarded_sigusr1_is_named_and_never_the_first_failure(tmp_path):
    # Rank 1 has a handler (a preemption warning it acts on); rank 0 has none and dies of it.
    job = py_job(tmp_path, """
import os, signal, sys, time
r = os.environ["RANK"]
if r == "1":
    # ddpctl stops this rank with SIGTERM once rank 0 died of the forwarded SIGUSR1, which can be
    # before this handler has run or finished: SIGTERM waits, blocked, until it has written.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    def usr1(*_):
        with open("usr1-1", "w") as f:
            f.write("got it")
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    signal.signal(signal.SIGUSR1, usr1)
open(f"worker-{r}.pid", "w").write(str(os.getpid()))
while True:
    time.sleep(1)
""", grace="2s")
    result = tmp_path / "r.json"
    p = start_launch(job, "--result-json", str(result))
    wait_for(lambda: len(list(tmp_path.glob("worker-*.pid"))) == 2, what="workers to start")
    p.send_signal(signal.SIGUSR1)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 1, err
    assert "first failure" not in err, err
    assert "rank 0 was killed by SIGUSR1, which ddpctl forwarded (it has no handler for it)" in err, err
    assert "no rank failed by itself:" in err, err
    res = json.loads(result.read_text())
    a = res["attempts"][0]
    assert a["first_failure"] is None, a
    by_rank = {e["rank"]: e for e in a["exits"]}
    assert by_rank[0]["signal"] == signal.SIGUSR1 and by_rank[0]["forwarded"] is True, a
    assert by_rank[1]["forwarded"] is False, a
    assert (tmp_path / "usr1-1").read_text() == "got it"
