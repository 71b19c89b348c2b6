"""The coordinator with agents of each protocol version it speaks, on loopback: version 4 to 6 agents
get each round's start inside their assign (one frame), version 3 agents (the previous release)
a start of their own; either way every node runs its share and the launch succeeds. The agents
are bench/rendezvous's fake_agents (the real protocol, workers that exit 0 at once)."""
import json
import os
import select
import subprocess

import pytest

from ddptest import BINARY_DIR, free_port_run, write_token

FAKE_AGENTS = str(BINARY_DIR / "bin" / "fake_agents")
DDPCTL = str(BINARY_DIR / "bin" / "ddpctl")
NODES = 3


@pytest.mark.parametrize("version", [3, 4, 5, 6])
def test_every_node_starts_whichever_version_it_speaks(tmp_path, version):
    assert os.path.exists(FAKE_AGENTS), f"{FAKE_AGENTS} is not built (scripts/build builds it)"
    token = write_token(tmp_path / "token")
    out = tmp_path / "agents.json"
    base = free_port_run(NODES)
    agents = subprocess.Popen([FAKE_AGENTS, "--count", str(NODES), "--base-port", str(base), "--token-file", str(token),
                               "--out", str(out), "--version", str(version)], stdout=subprocess.PIPE, text=True)
    try:
        assert select.select([agents.stdout], [], [], 30)[0], "fake_agents did not get ready in 30 s"
        assert agents.stdout.readline().strip() == "ready"
        job = tmp_path / "job.yaml"
        job.write_text("name: versions\nnproc_per_node: 1\ncommand: [/bin/true]\nstore: {port: 29500}\n")
        nodes = ",".join(f"127.0.0.1:{base + i}" for i in range(NODES))
        r = subprocess.run([DDPCTL, "launch", "--nodes", nodes, "--token-file", str(token), "--log-dir",
                            str(tmp_path / "logs"), str(job)], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert agents.wait(timeout=30) == 0
    finally:
        if agents.poll() is None:
            agents.kill()
            agents.wait()
    got = json.loads(out.read_text())
    assert got["assigned"] == NODES and got["finished"] == NODES, got
    # Node rank 0's assign goes out before the round's store exists, so its start is always separate.
    if version >= 4:
        assert (got["starts_in_assign"], got["separate_starts"]) == (NODES - 1, 1), got
    else:
        assert (got["starts_in_assign"], got["separate_starts"]) == (0, NODES), got
