"""The coordinator with agents of each protocol version it speaks, on loopback: version 4 to 7 agents
get each round's start inside their assign (one frame), version 3 agents (the previous release)
a start of their own; either way every node runs its share and the launch succeeds. The agents
are bench/rendezvous's fake_agents (the real protocol, workers that exit 0 at once)."""
import pytest

from fake_agents import launch_against_fake_agents

NODES = 3


@pytest.mark.parametrize("version", [3, 4, 5, 6, 7])
def test_every_node_starts_whichever_version_it_speaks(tmp_path, version):
    got = launch_against_fake_agents(tmp_path, NODES, "versions", ["--version", str(version)])
    assert got["assigned"] == NODES and got["finished"] == NODES, got
    # Node rank 0's assign goes out before the round's store exists, so its start is always separate.
    if version >= 4:
        assert (got["starts_in_assign"], got["separate_starts"]) == (NODES - 1, 1), got
    else:
        assert (got["starts_in_assign"], got["separate_starts"]) == (0, NODES), got
