"""One agent and one standing coordinator on loopback, both as the test's user, sharing a token
(no key_users: the single-tenant setup), and ddpctl run against them. For the coordinator's own
behaviour (relay bounds, the stop and signal relay); jobs across hosts are tested on simulated
hosts (multinode/test_coordinator.py)."""
import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from ddptest import BINARY_DIR, free_port, wait_listening, write_token

AGENTD = str(BINARY_DIR / "bin" / "ddp-agentd")
COORDINATOR = str(BINARY_DIR / "bin" / "ddp-coordinator")
DDPCTL = str(BINARY_DIR / "bin" / "ddpctl")


class LoopSite:
    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="ddp-loopsite-", dir="/var/tmp"))
        self.token = write_token(self.dir / "token")
        self.runtime = self.dir / "run"
        self.runtime.mkdir(mode=0o700)
        self.agent_port, self.coord_port = free_port(), free_port()
        self.procs = []

    def env(self):
        return dict(os.environ, XDG_RUNTIME_DIR=str(self.runtime))

    def start(self, argv, port, log_name, nofile=None):
        """`nofile`: (soft, hard) RLIMIT_NOFILE for the process."""
        log = self.dir / log_name
        limit = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, nofile)) if nofile else None
        p = subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=self.env(), cwd=self.dir,
                             preexec_fn=limit)
        self.procs.append(p)
        wait_listening(port, p, log)
        return p

    def start_agent(self):
        cfg = self.dir / "agent.yaml"
        cfg.write_text(f'listen: "127.0.0.1:{self.agent_port}"\n')
        return self.start([AGENTD, "--config", str(cfg), "--token-file", str(self.token), "--log-dir",
                           str(self.dir / "agent-logs"), "-v"], self.agent_port, "agent.log")

    def start_coordinator(self, nofile=None):
        self.coordinator = self.start([COORDINATOR, "--listen", f"127.0.0.1:{self.coord_port}", "--token-file",
                                       str(self.token), "--log-dir", str(self.dir / "coord-logs"), "-v"],
                                      self.coord_port, "coordinator.log", nofile)
        return self.coordinator

    def log(self, name):
        return (self.dir / name).read_text(errors="replace")

    def logs(self):
        return f"--- agent ---\n{self.log('agent.log')}\n--- coordinator ---\n{self.log('coordinator.log')}"

    def job(self, name, command, nproc=1, extra=""):
        path = self.dir / f"{name}.yaml"
        path.write_text(f"name: {name}\nnproc_per_node: {nproc}\ncommand: {json.dumps(command)}\nworkdir: {self.dir}\n"
                        f"store: {{port: {free_port()}}}\n{extra}")
        return path

    def ddpctl_argv(self, verb, *args):
        return [DDPCTL, verb, "--coordinator", f"127.0.0.1:{self.coord_port}", "--token-file", str(self.token), *args]

    def ddpctl(self, verb, *args, timeout=120):
        return subprocess.run(self.ddpctl_argv(verb, *args), cwd=self.dir, env=self.env(), capture_output=True,
                              text=True, timeout=timeout)

    def submit(self, job, *args, **popen):
        """`ddpctl launch --coordinator` started (not waited for)."""
        argv = self.ddpctl_argv("launch", "--nodes", f"127.0.0.1:{self.agent_port}", *args, str(job))
        return subprocess.Popen(argv, cwd=self.dir, env=self.env(), **popen)

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def running_site():
    """A LoopSite with its agent and coordinator started (a test's fixture), closed after."""
    s = LoopSite()
    try:
        s.start_agent()
        s.start_coordinator()
        yield s
    finally:
        s.close()
