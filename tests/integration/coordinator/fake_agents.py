"""One ddpctl launch --nodes against bench/rendezvous's fake_agents on loopback (the real
protocol, workers that exit 0 at once): the launch must succeed, and what the agents counted
(their --out JSON) is returned for the test to assert on."""
import json
import os
import select
import subprocess

from ddptest import BINARY_DIR, free_port_run, write_token

FAKE_AGENTS = str(BINARY_DIR / "bin" / "fake_agents")
DDPCTL = str(BINARY_DIR / "bin" / "ddpctl")


def launch_against_fake_agents(tmp_path, nodes, name, agent_args=(), job_extra="", env=None, stderr=None):
    """env: ddpctl's environment (default ours); stderr: a list that gets ddpctl's stderr."""
    assert os.path.exists(FAKE_AGENTS), f"{FAKE_AGENTS} is not built (scripts/build builds it)"
    token = write_token(tmp_path / "token")
    out = tmp_path / "agents.json"
    base = free_port_run(nodes)
    agents = subprocess.Popen([FAKE_AGENTS, "--count", str(nodes), "--base-port", str(base), "--token-file", str(token),
                               "--out", str(out), *agent_args], stdout=subprocess.PIPE, text=True)
    try:
        assert select.select([agents.stdout], [], [], 30)[0], "fake_agents did not get ready in 30 s"
        assert agents.stdout.readline().strip() == "ready"
        job = tmp_path / "job.yaml"
        job.write_text(f"name: {name}\nnproc_per_node: 1\ncommand: [/bin/true]\nstore: {{port: 29500}}\n{job_extra}")
        node_list = ",".join(f"127.0.0.1:{base + i}" for i in range(nodes))
        r = subprocess.run([DDPCTL, "launch", "--nodes", node_list, "--token-file", str(token), "--log-dir",
                            str(tmp_path / "logs"), str(job)], capture_output=True, text=True, timeout=60, env=env)
        if stderr is not None:
            stderr.append(r.stderr)
        assert r.returncode == 0, r.stderr
        assert agents.wait(timeout=30) == 0
    finally:
        if agents.poll() is None:
            agents.kill()
            agents.wait()
    return json.loads(out.read_text())
