"""What a launch says while nodes are missing, on loopback ports where no agent listens: a
"still waiting" line naming them (every quarter of a short join_timeout, every 30 s by default)
until the timeout fails the launch, and a warning when more nodes are listed than nnodes uses."""
import subprocess

from ddptest import BINARY_DIR, free_port, write_token

DDPCTL = str(BINARY_DIR / "bin" / "ddpctl")


def launch(tmp_path, nnodes, count):
    token = write_token(tmp_path / "token")
    job = tmp_path / "job.yaml"
    job.write_text(f"name: waiting\nnproc_per_node: 1\ncommand: [/bin/true]\nnnodes: {nnodes}\n"
                   "rendezvous: {join_timeout: 3s}\n")
    nodes = [f"127.0.0.1:{free_port()}" for _ in range(count)]
    r = subprocess.run([DDPCTL, "launch", "--nodes", ",".join(nodes), "--token-file", str(token), "--log-dir",
                        str(tmp_path / "logs"), str(job)], capture_output=True, text=True, timeout=60)
    return r, nodes


def test_missing_nodes_are_named_while_waiting_and_when_the_timeout_ends_it(tmp_path):
    r, nodes = launch(tmp_path, 2, 2)
    assert r.returncode == 1, r.stderr
    waiting = [line for line in r.stderr.splitlines() if "still waiting" in line]
    assert waiting, r.stderr
    assert all(n in waiting[0] for n in nodes) and "join_timeout: 3s" in waiting[0], waiting[0]
    assert "rendezvous timed out after 3s: 0/2 nodes joined; missing:" in r.stderr, r.stderr


def test_every_waiting_line_says_why_each_node_is_missing(tmp_path):
    # The reason was said once, in the first warning; every later line only named the nodes.
    r, nodes = launch(tmp_path, 2, 2)
    assert r.returncode == 1, r.stderr
    waiting = [line for line in r.stderr.splitlines() if "still waiting" in line]
    assert len(waiting) >= 2, r.stderr
    for line in waiting:
        for n in nodes:
            port = n.rsplit(":", 1)[1]
            assert f"connection refused: is ddp-agentd running there, listening on port {port}?" in line, line
    failed = [line for line in r.stderr.splitlines() if "rendezvous timed out" in line]
    assert failed and "connection refused: is ddp-agentd running there" in failed[0], r.stderr


def test_more_nodes_than_nnodes_is_said_up_front(tmp_path):
    r, _ = launch(tmp_path, 2, 3)
    assert "nnodes is 2 but 3 nodes are listed" in r.stderr, r.stderr
