"""Stacks in the failure report across simulated nodes (issue 24): a rank on n2 fails while the
ranks on n1 and n3 block in all_reduce; each node's shepherd reads its ranks' stacks before it
signals them, the agents send them with attempt_finished (protocol version 6), and the launcher
merges every node's into one report, its attempt folder and --result-json."""
import json
import os
import shutil
import sys

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


def test_a_failing_rank_on_one_node_shows_where_the_others_were_on_every_node():
    with simcluster.Cluster(nodes=3) as c:
        for h in c.hosts:
            c.start_agent(h)
        script = os.path.join(c.dir, "stuck_ranks.py")
        shutil.copy2(STUCK, script)
        # A long grace: the failing rank's child holds its connections until a peer goes, so
        # nothing here waits for the grace; it only must not end before the others were read.
        job = c.write("stk.yaml", f"name: stk\nnproc_per_node: 1\n"
                                  f"command: {json.dumps(['/usr/bin/python3', script, 'exit', '1'])}\n"
                                  f"store: {{port: 29500}}\nstop: {{grace: 60s}}\n")
        p = c.launch(job, "--job-id", "stk-nodes", "--result-json", os.path.join(c.dir, "r.json"))
        rc, out, err = finish(p, timeout=180)
        n1, n2, n3 = c.hosts
        assert rc == 1, out + err
        assert f"first failure: rank 1 (local rank 0, node {n2.addr}" in err and "exited with code 3" in err, err
        assert "while rank 1 exited with code 3, the ranks still running were:" in err, err
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
        main = [g for g in groups if any(m["rank"] == 0 and m["pid"] == m["tid"] for m in g["members"])]
        assert len(main) == 1 and main[0]["ranks"] == [0, 2] and main[0]["nodes"] == sorted([n1.addr, n3.addr]), groups
        assert [f["function"] for f in main[0]["python"][:2]] == ["all_reduce", "step"], main
        assert all(1 not in g["ranks"] for g in groups), groups
