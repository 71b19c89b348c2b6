"""Injected clock skew does not change which failure is first (issue 5). n2's agent runs 30 s
behind (libfaketime), so its exit stamps say "30 s earlier". Rank 0 on n1 fails first (exit 7);
rank 1 on n2 ignores the stop and fails on its own 0.5 s later (exit 9). Mapped through the
offset measured at the handshake, n2's exit comes after the stop and is its consequence; read
raw, it would look 29.5 s earlier than rank 0's and be named first."""
import json
import os
import re
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import simcluster  # noqa: E402

SKIP = simcluster.netns_unavailable()
FAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
if SKIP is None and not os.path.exists(FAKETIME):
    SKIP = "libfaketime is not installed (scripts/setup installs faketime)"
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

PY = "/usr/bin/python3"
WORKER = r'''
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # rank 1 fails on its own, not because it was stopped
time.sleep(1.0)
if os.environ["RANK"] == "0":
    sys.exit(7)
time.sleep(0.5)
sys.exit(9)
'''


def test_skewed_agent_clock_does_not_reorder_failures(monkeypatch):
    with simcluster.Cluster(nodes=2) as c:
        n1, n2 = c.hosts
        c.start_agent(n1)
        # The skew covers the agent's stamps (join, heartbeat, worker_exited); its workers are not ours
        # to skew, so LD_PRELOAD is left to the agent (the contract scrubs nothing it needs).
        c.start_agent(n2, env={"LD_PRELOAD": FAKETIME, "FAKETIME": "-30s", "FAKETIME_DONT_RESET": "1"})
        worker = c.write("skew.py", WORKER)
        job = c.write("skew.yaml", f"name: skew\nnproc_per_node: 1\ncommand: [{PY}, {worker}]\n"
                                   "store: {port: 29500}\nstop: {grace: 5s}\n")
        result = os.path.join(c.dir, "result.json")
        monkeypatch.setenv("DDP_LOG_LEVEL", "debug")  # ddpctl logs each node's measured clock offset
        p = c.launch(job, "--result-json", result)
        out, err = p.communicate(timeout=120)
        assert p.returncode == 1, out + err
        r = json.load(open(result))
        attempt = r["attempts"][0]
        first = attempt["first_failure"]
        assert first["rank"] == 0 and first["exit_code"] == 7 and first["node"] == n1.addr, (first, err)
        exits = {e["rank"]: e for e in attempt["exits"]}
        assert exits[1]["exit_code"] == 9, exits  # rank 1 did fail on its own, later
        # The skew was real: n2's offset was measured at about -30 s, n1's at about 0.
        offsets = {m.group(1): int(m.group(2)) for m in re.finditer(r"(10\.213\.\d+\.\d+) \([^)]*\): clock offset (-?\d+) us", err)}
        assert abs(offsets[n2.addr] + 30_000_000) < 2_000_000 and abs(offsets[n1.addr]) < 2_000_000, offsets
