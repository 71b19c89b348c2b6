"""An agent learns the job's Python and PyTorch on its node (lib/pyenv, through its preflight
helper, before the join) and sets the async-error-handling variable that release reads.

A local agent on loopback; the launcher's PATH (forwarded, as env_forward's default) puts a
virtualenv first: with the system's site packages (Debian's torch 1.13, which reads only
NCCL_ASYNC_ERROR_HANDLING), then without (no torch: the release is not known, both names)."""
import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from ddptest import BINARY_DIR, DDPCTL, PYTHON, free_port, write_job, write_token, wait_listening

AGENTD = str(BINARY_DIR / "bin" / "ddp-agentd")

WORKER = """
import json, os
names = {k: v for k, v in os.environ.items() if "ASYNC_ERROR_HANDLING" in k}
json.dump(names, open(f"async-{os.environ['RANK']}.json", "w"))
"""



@pytest.fixture
def agent(tmp_path):
    token, port, logs = write_token(tmp_path / "token"), free_port(), tmp_path / "agent-logs"
    log = open(tmp_path / "agent.log", "w")
    p = subprocess.Popen([AGENTD, "--listen", f"127.0.0.1:{port}", "--token-file", str(token), "--log-dir", str(logs)],
                         stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path)),
                         cwd=tmp_path)
    try:
        wait_listening(port, p)
        yield port, token, tmp_path / "agent.log"
    finally:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=30)
        log.close()


def test_agent_sets_the_name_its_nodes_torch_reads(agent, tmp_path):
    port, token, agent_log = agent
    (tmp_path / "worker.py").write_text(WORKER)
    job = write_job(tmp_path, f"nproc_per_node: 1\ncommand: [python3, worker.py]\nworkdir: {tmp_path}\nstore: {{port: 0}}\n")
    for name, system_site, expected in (("venv-sys", True, {"NCCL_ASYNC_ERROR_HANDLING": "1"}),
                                        ("venv-bare", False, {"NCCL_ASYNC_ERROR_HANDLING": "1",
                                                              "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"})):
        d = tmp_path / name
        subprocess.run([PYTHON, "-m", "venv", "--without-pip", *(["--system-site-packages"] if system_site else []),
                        str(d)], check=True, timeout=120)
        env = dict(os.environ, PATH=f"{d / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}", VIRTUAL_ENV=str(d))
        r = subprocess.run([DDPCTL, "launch", "--nodes", f"127.0.0.1:{port}", "--token-file", str(token), str(job)],
                           capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
        assert r.returncode == 0, r.stderr
        assert json.loads((tmp_path / "async-0.json").read_text()) == expected, name
        # The agent says which interpreter it asked and what it answered.
        text = agent_log.read_text()
        assert f"Python {d}/bin/python3 3." in text, text
        assert (", torch 1.13." if system_site else ", torch none") in text.split(f"Python {d}/bin/python3", 1)[1], text
