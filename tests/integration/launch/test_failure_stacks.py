"""Stacks in the failure report (issue 24): when a rank fails or the job is stopped, where the ranks
still running were, read before they were signalled, in the report, the attempt's folder and
--result-json. Real processes, gloo on CPU."""
import json
import shutil
import signal
import time
from pathlib import Path

from ddptest import PYTHON, SOURCE_DIR, launch, start_launch, write_job

STUCK = SOURCE_DIR / "tests" / "integration" / "launch" / "stuck_ranks.py"


def line_of(marker: str) -> int:
    for i, text in enumerate(STUCK.read_text().splitlines(), 1):
        if marker in text:
            return i
    raise AssertionError(marker)


def stuck_job(tmp: Path, mode: str, odd: int, nproc=4, grace="30s"):
    script = tmp / "stuck_ranks.py"
    shutil.copy2(STUCK, script)
    return write_job(tmp, f"nproc_per_node: {nproc}\ncommand: [{PYTHON}, {script}, {mode}, '{odd}']\n"
                          f"stop: {{grace: {grace}}}\n")


def groups_of(result, attempt=0):
    stacks = result["attempts"][attempt]["stacks"]
    assert stacks is not None, result
    return stacks["groups"]


def main_thread_group(groups, rank):
    """The group holding `rank`'s main thread."""
    for g in groups:
        for m in g["members"]:
            if m["rank"] == rank and m["pid"] == m["tid"]:
                return g
    raise AssertionError(f"rank {rank}'s main thread is in no group: {groups}")


def test_a_failing_rank_shows_where_the_others_were(tmp_path):
    job = stuck_job(tmp_path, "exit", 1)
    r = launch(job, "--job-id", "stk", "--result-json", str(tmp_path / "r.json"), timeout=180)
    assert r.returncode == 1, r.stderr
    step = f"step ({STUCK.name}:{line_of('# STEP_LINE')})"
    # the report: rank 1's exit, then one line for the three others, in the collective
    assert "first failure: rank 1 " in r.stderr and "exited with code 3" in r.stderr, r.stderr
    assert "while rank 1 exited with code 3, the ranks still running were:" in r.stderr, r.stderr
    assert f"ranks 0,2,3 were in all_reduce (distributed_c10d.py:" in r.stderr, r.stderr
    assert f") <- {step}" in r.stderr, r.stderr
    folder = tmp_path / "logs" / "stk" / "attempt-0"
    assert f"every thread's stack: {folder}/stacks.txt" in r.stderr, r.stderr
    # the attempt's folder: every thread's stack, as text and JSON
    text = (folder / "stacks.txt").read_text()
    assert "ranks 0,2,3 (3 of 4)" in text and f"step ({script_path(tmp_path)}:" in text, text
    kept = json.loads((folder / "stacks.json").read_text())
    # --result-json: the same groups, each rank's main thread in all_reduce, called from step()
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["attempts"][0]["stacks"]["file"] == str(folder / "stacks.txt")
    for groups in (groups_of(result), kept["groups"]):
        g = main_thread_group(groups, 0)
        assert g["ranks"] == [0, 2, 3], groups
        names = [f["function"] for f in g["python"]]
        assert names[0] == "all_reduce" and names[1] == "step", names
        assert g["python"][1]["line"] == line_of("# STEP_LINE")
        assert all(1 not in x["ranks"] for x in groups), "rank 1 had exited: it has no stack"


def script_path(tmp: Path) -> str:
    return str(tmp / "stuck_ranks.py")


def test_ctrl_c_shows_the_function_a_rank_is_stuck_in(tmp_path):
    job = stuck_job(tmp_path, "sleep", 2)
    p = start_launch(job, "--job-id", "stk-int", "--result-json", str(tmp_path / "r.json"))
    try:
        arrived = 0
        deadline = time.monotonic() + 120
        while arrived < 4 and time.monotonic() < deadline:
            line = p.stdout.readline()
            if not line:
                break
            arrived += " AT " in line
        assert arrived == 4, "the ranks did not all get where the test wants them"
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == 130, err
    loader = f"wait_for_the_data_loader ({STUCK.name}:{line_of('# LOADER_LINE')})"
    assert "when the attempt was stopped, its ranks were:" in err, err
    assert f"rank 2 was in {loader} <- <module> ({STUCK.name}:" in err, err
    assert "ranks 0,1,3 were in all_reduce (distributed_c10d.py:" in err, err
    g = main_thread_group(groups_of(json.loads((tmp_path / "r.json").read_text())), 2)
    assert g["ranks"] == [2] and g["python"][0]["function"] == "wait_for_the_data_loader", g


def test_ranks_that_are_not_python_say_why_and_stop_promptly(tmp_path):
    # Rank 1 exits 3 at once; rank 0 is a shell that sleeps (no Python to read). The stop grace
    # is long: the job ends promptly only if the stacks step does not hold the SIGTERM back.
    job = write_job(tmp_path, "nproc_per_node: 2\n"
                              "command: [/bin/sh, -c, 'if [ \"$RANK\" = 1 ]; then exit 3; fi; exec sleep 600']\n"
                              "stop: {grace: 120s}\n")
    started = time.monotonic()
    r = launch(job, "--job-id", "stk-sh", "--result-json", str(tmp_path / "r.json"), timeout=120)
    took = time.monotonic() - started
    assert r.returncode == 1, r.stderr
    assert took < 30, f"the job took {took:.1f} s to stop"
    assert "while rank 1 exited with code 3, the ranks still running were:" in r.stderr, r.stderr
    assert "rank 0: no stack (not a Python process" in r.stderr, r.stderr
    assert "rank 0 was killed by SIGTERM" in r.stderr, r.stderr
    g = main_thread_group_or_note(groups_of(json.loads((tmp_path / "r.json").read_text())), 0)
    assert "not a Python process" in g["note"], g


def main_thread_group_or_note(groups, rank):
    for g in groups:
        if rank in g["ranks"]:
            return g
    raise AssertionError(groups)
