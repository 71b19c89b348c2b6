"""A slow NCCL start on node rank 0 does not make the node look lost (issue 23).

Node rank 0's agent waits for its ddp-ncclid holder's id line (NCCL scans the interfaces first),
on the loop that also sends its heartbeats and reads the coordinator's. Here the holder is a
stand-in (a shell script in place of ddp-ncclid) that takes longer than the heartbeat timeouts
(the launcher's, rendezvous.heartbeat_timeout 3s here; the agents', 3 s in simcluster) before
it runs the real ddp-ncclid: a wait that blocks the loop sends no heartbeat meanwhile, and the
launcher finds node rank 0 lost; an asynchronous one answers `ready` when the id comes, with
heartbeats going on meanwhile.
"""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import simcluster  # noqa: E402
from simcluster import finish  # noqa: E402
from test_nccl_id_nodes import nccl_loadable  # noqa: E402

SKIP = simcluster.netns_unavailable()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

PY = "/usr/bin/python3"
SLOW_S = 5  # the stand-in's delay: more than the heartbeat timeouts (3 s both ways)

WORKER = r'''
import json, os, sys
json.dump({"id": os.environ.get("DDP_NCCL_UNIQUE_ID")}, open(os.path.join(sys.argv[1], "rank-" + os.environ["RANK"]), "w"))
'''


@pytest.mark.skipif(not nccl_loadable(), reason="libnccl.so.2 is not loadable here")
def test_a_holder_slower_than_the_heartbeat_timeout_loses_no_node():
    with simcluster.Cluster(nodes=2) as c:
        # The stand-in: what a slow NCCL start looks like from the agent (a late id line), then
        # the real holder with the same argv, pid and pipes.
        real = os.path.join(c.bin, "ddp-ncclid.real")
        os.rename(os.path.join(c.bin, "ddp-ncclid"), real)
        c.write("bin/ddp-ncclid", f"#!/bin/sh\nsleep {SLOW_S}\nexec {real} \"$@\"\n")
        os.chmod(os.path.join(c.bin, "ddp-ncclid"), 0o755)
        for h in c.hosts:
            c.start_agent(h)
        worker = c.write("slowid.py", WORKER)
        out = os.path.join(c.dir, "out")
        os.makedirs(out)
        job = c.write("slowid.yaml", f"name: slowid\nnproc_per_node: 1\ncommand: {json.dumps([PY, worker, out])}\n"
                                     "nccl: {unique_id: on}\nstore: {port: 0}\nrendezvous: {heartbeat_timeout: 3s}\n")
        rc, _, err = finish(c.launch(job), timeout=120)
        log = c.agent_log(c.hosts[0])
        assert rc == 0, f"{err}\n{log}"
        assert "lost" not in err and "no heartbeat" not in err, err
        assert "no heartbeat" not in log, log
        ids = {json.load(open(os.path.join(out, f)))["id"] for f in os.listdir(out)}
        assert len(os.listdir(out)) == 2 and len(ids) == 1 and len(ids.pop() or "") == 256, ids
