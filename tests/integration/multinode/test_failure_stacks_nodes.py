"""Stacks in the failure report across simulated nodes (issue 24): Ctrl-C to the launcher while
the rank on n2 is stuck in a Python function and the ranks on n1 and n3 block in all_reduce. Each
node's shepherd reads its ranks' stacks before it signals them, the agents send them with
attempt_finished (protocol version 6), and the launcher merges every node's into one report,
its attempt folder and --result-json."""
import json
import os
import shutil
import signal
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import simcluster  # noqa: E402
from simcluster import finish  # noqa: E402

SKIP = simcluster.netns_unavailable()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

STUCK = os.path.join(simcluster.SRC, "tests", "integration", "launch", "stuck_ranks.py")


def line_of(marker):
    with open(STUCK) as f:
        for i, text in enumerate(f, 1):
            if marker in text:
                return i
    raise AssertionError(marker)


def test_ctrl_c_shows_where_every_nodes_ranks_were():
    with simcluster.Cluster(nodes=3) as c:
        for h in c.hosts:
            c.start_agent(h)
        script = os.path.join(c.dir, "stuck_ranks.py")
        shutil.copy2(STUCK, script)
        job = simcluster.job_file(c, "stk", ["/usr/bin/python3", script, "sleep", "1"])
        p = c.launch(job, "--job-id", "stk-nodes", "--result-json", os.path.join(c.dir, "r.json"))
        arrived, lines = 0, []
        deadline = time.time() + 120
        while arrived < 3 and time.time() < deadline:
            line = p.stdout.readline()
            if not line:
                break
            lines.append(line)
            arrived += "] AT " in line
        if arrived < 3:
            p.kill()
            _, err = p.communicate(timeout=30)
            raise AssertionError("the ranks did not all get where the test wants them:\n" + "".join(lines) + err)
        os.kill(p.pid, signal.SIGINT)
        rc, out, err = finish(p, timeout=60)
        n1, n2, n3 = c.hosts
        assert rc == 128 + signal.SIGINT, out + err
        assert "when the attempt was stopped, its ranks were:" in err, err
        loader = f"wait_for_the_data_loader (stuck_ranks.py:{line_of('# LOADER_LINE')})"
        assert f"rank 1 on {n2.addr} was in {loader} <- <module> (stuck_ranks.py:" in err, err
        step = f"step (stuck_ranks.py:{line_of('# STEP_LINE')})"
        assert f"ranks 0,2 on {n1.addr} and 1 other node were in all_reduce (distributed_c10d.py:" in err, err
        assert f") <- {step}" in err, err
        folder = os.path.join(c.dir, "logs", "stk-nodes", "attempt-0")
        assert f"every thread's stack: {folder}/stacks.txt" in err, err
        with open(os.path.join(folder, "stacks.txt")) as f:
            text = f.read()
        assert f"ranks 0,2 (2 of 3) on {n1.addr},{n3.addr}" in text, text
        with open(os.path.join(c.dir, "r.json")) as f:
            result = json.load(f)
        groups = result["attempts"][0]["stacks"]["groups"]

        def main_group(rank):
            found = [g for g in groups if any(m["rank"] == rank and m["pid"] == m["tid"] for m in g["members"])]
            assert len(found) == 1, groups
            return found[0]
        assert main_group(0)["ranks"] == [0, 2] and main_group(0)["nodes"] == sorted([n1.addr, n3.addr]), groups
        assert [f["function"] for f in main_group(0)["python"][:2]] == ["all_reduce", "step"], groups
        assert main_group(1)["nodes"] == [n2.addr], groups
        assert main_group(1)["python"][0]["function"] == "wait_for_the_data_loader", groups
