"""The hang watchdog across 3 simulated nodes (simcluster.py has the rules): each node's shepherd
samples its ranks and tells the coordinator when the node goes idle; the job is hung only when no
rank on any node progressed. Rank 1 (on the first node) is stuck in Python while the others wait
in gloo's all_reduce: the job fails as hung, with every node's stacks; a rank computing silently
on one node keeps the whole job alive. Timeouts are a few seconds; no assertion is about speed."""
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

PY = "/usr/bin/python3"


@pytest.fixture
def cluster():
    with simcluster.Cluster(nodes=3) as c:
        for h in c.hosts:
            c.start_agent(h)
        yield c


def hang_job(c, name, args, hang):
    # The worker must be where every host sees it (each simulated host has its own /tmp).
    worker = os.path.join(c.dir, "hang_worker.py")
    shutil.copy2(os.path.join(simcluster.SRC, "tests", "integration", "launch", "hang_worker.py"), worker)
    return simcluster.job_file(c, name, [PY, worker, *args], nproc=2, extra=f"hang: {hang}\nnccl: {{unique_id: off}}\n")


def test_stuck_rank_on_one_node_is_a_hang_of_the_job(cluster):
    c = cluster
    result = os.path.join(c.dir, "r.json")
    rc, out, err = finish(c.launch(hang_job(c, "hang", ["hang"], "{timeout: 3s, action: stop}"), "--result-json", result),
                          timeout=120)
    assert rc == 124, out + err
    assert "hung: no rank made progress for 3s on any node" in err, err
    # every node's stacks: rank 1's function, the others' all_reduce
    assert "stuck_forever" in err and "all_reduce" in err, err
    for h in c.hosts:
        assert f"node {h.addr}:" in err, err
    r = json.load(open(result))
    assert r["status"] == "failed" and r["exit_code"] == 124
    assert r["message"] == "hung: no rank made progress for 3s"
    logs = [os.path.join(root, f) for root, _, files in os.walk(c.dir) for f in files if f == "hang-stacks.txt"]
    assert logs and "stuck_forever" in open(logs[0]).read()


def test_silent_computation_on_one_node_is_not_a_hang(cluster):
    c = cluster
    # 5 s, not less: six ranks importing torch at once on a loaded test machine stand still in
    # dlopen (waiting for the disk: no CPU, one stack) for seconds, which a 2 s watchdog calls a hang.
    rc, out, err = finish(c.launch(hang_job(c, "silent", ["silent", "16"], "{timeout: 5s, action: stop}")), timeout=240)
    assert rc == 0, out + err
    assert "computed silently: python" in out
    assert "hung" not in err, err
