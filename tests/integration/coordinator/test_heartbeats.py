"""The coordinator's heartbeats answer the agents': each agent's beat gets the coordinator's in the
same wakeup (the reply carries the TCP ACK of the agent's beat; docs/performance.md, heartbeats),
instead of a beat on a timer of the coordinator's own at an unrelated moment. The agents are
bench/rendezvous's fake_agents, beating every second as real agents do."""
import json
import os
import select
import subprocess

from ddptest import BINARY_DIR, free_port_run, write_token

FAKE_AGENTS = str(BINARY_DIR / "bin" / "fake_agents")
DDPCTL = str(BINARY_DIR / "bin" / "ddpctl")
NODES = 3


def test_the_coordinator_answers_each_agents_beat(tmp_path):
    assert os.path.exists(FAKE_AGENTS), f"{FAKE_AGENTS} is not built (scripts/build builds it)"
    token = write_token(tmp_path / "token")
    out = tmp_path / "agents.json"
    base = free_port_run(NODES)
    # Workers that run 4.5 s: about four beats from each agent while the job runs.
    agents = subprocess.Popen([FAKE_AGENTS, "--count", str(NODES), "--base-port", str(base), "--token-file", str(token),
                               "--out", str(out), "--work-ms", "4500", "--heartbeat-ms", "1000"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert select.select([agents.stdout], [], [], 30)[0], "fake_agents did not get ready in 30 s"
        assert agents.stdout.readline().strip() == "ready"
        job = tmp_path / "job.yaml"
        job.write_text("name: beats\nnproc_per_node: 1\ncommand: [/bin/true]\nstore: {port: 29500}\n")
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
    assert got["agent_beats"] >= 3 * NODES, got
    # Answered within 100 ms: every beat, but for one sent as the job ended or a reply a loaded
    # machine held up (hence 60%, not all); a coordinator beating on a timer of its own lands
    # within 100 ms of an agent's beat about one time in ten (the old one: 0 of 14).
    assert got["coordinator_answers"] >= 0.6 * got["agent_beats"], got
    assert got["coordinator_answers"] >= 0.6 * got["coordinator_beats"], got
