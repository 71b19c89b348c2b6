"""NCCL flight recorder dumps from every node reach the launcher's report (issue 24 item 5):
each agent reads its node's dumps with the job's Python as the job's user (the preflight helper)
and sends them with attempt_finished (protocol version 6); the coordinator names the collective.

Debian's PyTorch 1.13 has no flight recorder and gloo none either (tests/gpu/flight_on_h200.sh
makes real ones with NCCL). So that ddpctl turns it on, the job's Python is shown a torch 2.11
distribution record (a dist-info folder on PYTHONPATH: what lib/pyenv's probe reads, torch itself
is never imported by it); each rank then writes its own dump, a pickle in the recorder's layout,
under the name the recorder was given, passes a gloo barrier (so every dump is written), and rank
0 fails as a rank whose collective timed out does. Rank 3, on the other node, never entered #4."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import simcluster  # noqa: E402
from simcluster import finish  # noqa: E402

SKIP = simcluster.netns_unavailable()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

PY = "/usr/bin/python3"

WORKER = r'''
import os, pickle, sys, time
import torch.distributed as dist
rank = int(os.environ["RANK"])
prefix = os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]  # set by ddpctl: <attempt folder>/nccl-flight-rank-
def entry(seq, state):
    return {"record_id": seq - 1, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": seq,
            "p2p_seq_id": 0, "op_id": seq, "profiling_name": "nccl:all_reduce", "time_created_ns": 1000 + seq,
            "input_sizes": [[1048576]], "input_dtypes": ["Float"], "output_sizes": [[1048576]],
            "output_dtypes": ["Float"], "state": state, "retired": state == "completed", "timeout_ms": 30000,
            "is_p2p": False, "frames": []}
entries = [entry(s, "completed") for s in (1, 2, 3)] + ([] if rank == 3 else [entry(4, "started")])
with open(f"{prefix}{rank}", "wb") as f:
    pickle.dump({"version": "2.4", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}},
                 "pg_status": {}, "entries": entries}, f)
dist.init_process_group("gloo")
dist.barrier()
if rank == 0:
    sys.exit(6)
time.sleep(600)
'''

EXPECTED = "flight recorder: ranks 0-2 entered all_reduce #4 (pg 0, 4 MiB), rank 3 did not"


@pytest.fixture
def cluster():
    with simcluster.Cluster(nodes=2) as c:
        yield c


def test_every_nodes_dumps_reach_the_report(cluster):
    c = cluster
    for h in c.hosts:
        c.start_agent(h)
    fake = os.path.join(c.dir, "fake-torch")
    os.makedirs(os.path.join(fake, "torch-2.11.0.dist-info"))
    with open(os.path.join(fake, "torch-2.11.0.dist-info", "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0\n")
    os.chmod(fake, 0o755)
    worker = c.write("flight_worker.py", WORKER)
    job = simcluster.job_file(c, "flight", [PY, worker], nproc=2,
                              extra=f"env: {{PYTHONPATH: {fake}}}\n")
    p = c.launch(job, "--result-json", os.path.join(c.dir, "r.json"))
    rc, out, err = finish(p, timeout=90)
    assert rc == 1, err
    assert EXPECTED in err, err
    notes = json.load(open(os.path.join(c.dir, "r.json")))["attempts"][0]["notes"]
    assert EXPECTED in notes, notes
