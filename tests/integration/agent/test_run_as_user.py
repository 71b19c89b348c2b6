"""Per-user tokens (agent.yaml's key_users): a job runs as the local user its key maps to, a job
claiming another user is refused before anything runs, and root only with allow_root: true.

A local agent on loopback (the network rule: nothing leaves the root namespace's loopback). The
test makes a throwaway user with useradd (and a supplementary group it joins) and removes both
at the end; the launcher runs as that user through setpriv, as a user on a login node would."""
import glob
import json
import os
import pwd
import grp
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from ddptest import BINARY_DIR, free_port, write_secret_file

AGENTD = str(BINARY_DIR / "bin" / "ddp-agentd")
DDPCTL = str(BINARY_DIR / "bin" / "ddpctl")

# What each worker reports about itself: printed, and with --in-home also written into its HOME
# (which must then be the user's and writable by it).
WORKER = r'''
import json, os, sys
ids = {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": sorted(os.getgroups()),
       "HOME": os.environ.get("HOME"), "USER": os.environ.get("USER"), "LOGNAME": os.environ.get("LOGNAME"),
       "rank": int(os.environ["RANK"])}
if sys.argv[1:] == ["--in-home"]:
    with open(os.path.join(os.environ["HOME"], f"ids-{ids['rank']}.json"), "w") as f:
        json.dump(ids, f)
print("ids", json.dumps(ids), flush=True)
'''


def needs():
    if os.geteuid() != 0:
        return "needs root (useradd, and an agent that switches users)"
    for tool in ("useradd", "userdel", "groupadd", "groupdel", "setpriv"):
        if not shutil.which(tool):
            return f"'{tool}' not found"
    return None



class Node:
    """A throwaway user and group, a shared folder, token files and an agent on loopback."""

    def __init__(self):
        tag = f"{os.getpid() % 100000}"
        self.user, self.extra_group = f"ddpu{tag}", f"ddpg{tag}"
        # Not under pytest's tmp_path (mode 0700): the user's workers must reach their files.
        self.dir = Path(tempfile.mkdtemp(prefix="ddp-runas-", dir="/var/tmp"))
        os.chmod(self.dir, 0o755)
        self.home = self.dir / "home"
        self.made_user = self.made_group = False
        self.agent = None
        self.agent_log = self.dir / "agent.log"
        self.log_dir = self.dir / "agent-logs"
        self.port = free_port()
        self.user_secret, self.root_secret = os.urandom(32).hex(), os.urandom(32).hex()

    def setup(self):
        subprocess.run(["groupadd", self.extra_group], check=True, capture_output=True)
        self.made_group = True
        subprocess.run(["useradd", "-m", "-d", str(self.home), "-s", "/bin/sh", "-U", "-G", self.extra_group,
                        self.user], check=True, capture_output=True)
        self.made_user = True
        self.pw = pwd.getpwnam(self.user)
        self.extra_gid = grp.getgrnam(self.extra_group).gr_gid
        # The agent holds both keys; each launcher holds its own.
        self.agent_token = self.dir / "agent-token"
        write_secret_file(self.agent_token, f"u-key: {self.user_secret}\nroot-key: {self.root_secret}\n")
        self.user_token = self.home / "token"
        write_secret_file(self.user_token, f"u-key: {self.user_secret}\n", self.pw.pw_uid, self.pw.pw_gid)
        self.stolen_token = self.dir / "root-holds-user-key"
        write_secret_file(self.stolen_token, f"u-key: {self.user_secret}\n")
        self.root_token = self.dir / "root-token"
        write_secret_file(self.root_token, f"root-key: {self.root_secret}\n")
        (self.dir / "worker.py").write_text(WORKER)
        (self.dir / "worker.py").chmod(0o644)

    def teardown(self):
        self.stop_agent()
        if self.made_user:
            subprocess.run(["userdel", self.user], capture_output=True)
            # userdel removes the user's own group (USERGROUPS_ENAB); make sure.
            if subprocess.run(["getent", "group", self.user], capture_output=True).returncode == 0:
                subprocess.run(["groupdel", self.user], capture_output=True)
        if self.made_group:
            subprocess.run(["groupdel", self.extra_group], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)

    def start_agent(self, config_text):
        cfg = self.dir / "agent.yaml"
        cfg.write_text(f'listen: "127.0.0.1:{self.port}"\n{config_text}')
        log = open(self.agent_log, "w")
        self.agent = subprocess.Popen([AGENTD, "--config", str(cfg), "--token-file", str(self.agent_token),
                                       "--log-dir", str(self.log_dir), "-v"],
                                      stdout=log, stderr=subprocess.STDOUT, text=True)
        return self.agent

    def wait_listening(self):
        import time
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.agent.poll() is None, self.agent_log.read_text()
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        raise AssertionError("the agent does not listen:\n" + self.agent_log.read_text())

    def stop_agent(self):
        if self.agent and self.agent.poll() is None:
            self.agent.send_signal(signal.SIGTERM)
            try:
                self.agent.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.agent.kill()
                self.agent.wait(timeout=30)
        self.agent = None

    def job(self, name, marker=None, in_home=False, extra="", workdir=None):
        command = f"[/usr/bin/touch, '{marker}']" if marker else \
            f"[/usr/bin/python3, {self.dir}/worker.py{', --in-home' if in_home else ''}]"
        path = self.dir / f"{name}.yaml"
        path.write_text(f"name: {name}\ncommand: {command}\nnproc_per_node: 2\nworkdir: {workdir or self.dir}\n"
                        f"store: {{port: {free_port()}}}\n{extra}")
        path.chmod(0o644)
        return path

    def launch(self, job, token, as_user=False):
        argv = [DDPCTL, "launch", "--nodes", f"127.0.0.1:{self.port}", "--token-file", str(token), str(job)]
        env = dict(os.environ)
        cwd = self.dir
        if as_user:
            argv = ["setpriv", f"--reuid={self.pw.pw_uid}", f"--regid={self.pw.pw_gid}", "--init-groups", *argv]
            env.update(HOME=str(self.home), USER=self.user, LOGNAME=self.user)
            env.pop("XDG_RUNTIME_DIR", None)
            env.pop("XDG_CONFIG_HOME", None)
            env.pop("XDG_STATE_HOME", None)
            cwd = self.home
        return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)


@pytest.fixture
def node():
    reason = needs()
    if reason:
        pytest.skip(reason)
    n = Node()
    try:
        n.setup()
        yield n
    finally:
        n.teardown()


def test_job_runs_as_the_user_its_key_maps_to(node):
    node.start_agent(f"key_users:\n  u-key: {node.user}\n")
    node.wait_listening()
    r = node.launch(node.job("runas", in_home=True), node.user_token, as_user=True)
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n{node.agent_log.read_text()}"
    for rank in (0, 1):
        path = node.home / f"ids-{rank}.json"
        ids = json.loads(path.read_text())
        assert ids["uid"] == ids["euid"] == node.pw.pw_uid, ids
        assert ids["gid"] == node.pw.pw_gid, ids
        # initgroups: the user's own group and the supplementary one, nothing of root's.
        assert ids["groups"] == sorted({node.pw.pw_gid, node.extra_gid}), ids
        assert ids["HOME"] == str(node.home) and ids["USER"] == ids["LOGNAME"] == node.user, ids
        assert path.stat().st_uid == node.pw.pw_uid
    # The node's per-rank logs belong to the user too, and hold the workers' output.
    logs = sorted(glob.glob(str(node.log_dir / node.user / "runas-*" / "attempt-0" / "rank-*.log")))
    assert len(logs) == 2, logs
    for log in logs:
        assert os.stat(log).st_uid == node.pw.pw_uid, log
        assert '"uid": %d' % node.pw.pw_uid in Path(log).read_text()
    assert os.stat(os.path.dirname(logs[0])).st_uid == node.pw.pw_uid
    assert f"runs as uid {node.pw.pw_uid}" in node.agent_log.read_text()


def test_a_job_claiming_another_user_is_refused_and_nothing_runs(node):
    node.start_agent(f"key_users:\n  u-key: {node.user}\n")
    node.wait_listening()
    marker = node.dir / "ran"
    # root holds the user's key: the job's user (root) is not the key's.
    r = node.launch(node.job("claim", marker), node.stolen_token)
    assert r.returncode != 0
    assert f"key 'u-key' runs jobs only as user '{node.user}', but this job's user is 'root'" in r.stderr, r.stderr
    # A key key_users does not list runs nothing either.
    r = node.launch(node.job("unmapped", marker), node.root_token)
    assert r.returncode != 0
    assert "key 'root-key' is not mapped to a local user here" in r.stderr, r.stderr
    # A workdir the user cannot enter is named before anything runs (root could enter it).
    private = node.dir / "root-only"
    private.mkdir(mode=0o700)
    r = node.launch(node.job("private", marker, workdir=private), node.user_token, as_user=True)
    assert r.returncode != 0
    assert f"user {node.user} cannot enter workdir {private}" in r.stderr, r.stderr
    # A container job as the mapped user may not hand root's runtime flags of its own.
    r = node.launch(node.job("incontainer", marker,
                             extra="container: {runtime: podman, image: ddp-none:1, extra_args: [--privileged]}\n"),
                    node.user_token, as_user=True)
    assert r.returncode != 0
    assert "container.extra_args (--privileged) are not allowed for a mapped user's container" in r.stderr, r.stderr
    assert not marker.exists()
    assert not glob.glob(str(node.log_dir / "*" / "*" / "attempt-*" / "rank-*.log"))
    node.stop_agent()
    assert "refused" in node.agent_log.read_text()


def test_root_only_when_the_config_allows_it(node):
    p = node.start_agent("key_users:\n  root-key: root\n")
    p.wait(timeout=60)
    assert p.returncode == 2
    text = node.agent_log.read_text()
    assert f"{node.dir}/agent.yaml:3:13: error: key_users: key 'root-key' maps to root; jobs run as root only with " \
           "allow_root: true" in text, text

    node.start_agent("key_users:\n  root-key: root\nallow_root: true\n")
    node.wait_listening()
    r = node.launch(node.job("asroot"), node.root_token)
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n{node.agent_log.read_text()}"
    ids = [json.loads(line.split("ids ", 1)[1]) for line in r.stdout.splitlines() if "ids {" in line]
    assert len(ids) == 2 and all(i["uid"] == 0 for i in ids), r.stdout


def test_an_unknown_user_stops_the_agent_at_start_naming_the_line(node):
    p = node.start_agent("key_users:\n  u-key: ddp-nobody-here\n")
    p.wait(timeout=60)
    assert p.returncode == 2
    text = node.agent_log.read_text()
    assert f"{node.dir}/agent.yaml:3:10: error: key_users: key 'u-key': no local user 'ddp-nobody-here'" in text, text


def test_a_mapped_user_cannot_make_the_root_agent_bind_a_privileged_port(node):
    node.start_agent(f"key_users:\n  u-key: {node.user}\n")
    node.wait_listening()
    marker = node.dir / "ran"
    job = node.dir / "port81.yaml"
    job.write_text(f"name: port81\ncommand: [/usr/bin/touch, '{marker}']\nnproc_per_node: 1\nworkdir: {node.dir}\n"
                   "store: {port: 81}\n")
    job.chmod(0o644)
    r = node.launch(job, node.user_token, as_user=True)
    assert r.returncode != 0
    assert f"store port 81 is a privileged port (below 1024), which user {node.user} could not bind" in r.stderr, \
        f"{r.stderr}\n{node.agent_log.read_text()}"
    assert not marker.exists()
    # Nothing listens there for the job (the agent never bound it).
    assert f"store on 127.0.0.1:81" not in node.agent_log.read_text()


def test_stacks_of_a_users_job_are_read_as_that_user(node):
    """`ddpctl stacks --native` through the agent: the shepherd's reader drops to the job's user
    before libdw opens the job's files. A worker binary that only root may read (made so after
    the workers started from it) is not symbolised; readable again, it is."""
    from ddptest import wait_for
    exe = node.dir / "stuck_worker"
    shutil.copy2(BINARY_DIR / "tests" / "stacks_stuck_worker", exe)
    exe.chmod(0o755)
    job = node.dir / "cjob.yaml"
    job.write_text(f"name: cjob\ncommand: [{exe}]\nnproc_per_node: 2\nworkdir: {node.dir}\n"
                   f"store: {{port: {free_port()}}}\nstop: {{grace: 2s}}\n")
    job.chmod(0o644)
    node.start_agent(f"key_users:\n  u-key: {node.user}\n")
    node.wait_listening()
    as_user = ["setpriv", f"--reuid={node.pw.pw_uid}", f"--regid={node.pw.pw_gid}", "--init-groups"]
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "XDG_STATE_HOME")}
    env.update(HOME=str(node.home), USER=node.user, LOGNAME=node.user)
    p = subprocess.Popen([*as_user, DDPCTL, "launch", "--nodes", f"127.0.0.1:{node.port}", "--token-file",
                          str(node.user_token), "--job-id", "cjob-u", str(job)], cwd=node.home, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def names():
            r = subprocess.run([*as_user, DDPCTL, "stacks", "cjob-u", "--native", "--json"], cwd=node.home, env=env,
                               capture_output=True, text=True, timeout=120)
            try:
                procs = json.loads(r.stdout)["processes"]
            except (ValueError, KeyError):
                return None
            return [[f["function"] for t in pr["threads"] if t["main"] for f in t["native"]] for pr in procs]

        wait_for(lambda: (n := names()) and len(n) == 2 and all("stuck_in_c_function" in x for x in n), timeout=60,
                 what="both ranks' native stacks through the agent")
        exe.chmod(0o700)  # root's alone now
        unnamed = names()
        assert unnamed and len(unnamed) == 2 and all("stuck_in_c_function" not in x and x for x in unnamed), unnamed
        exe.chmod(0o755)
        assert all("stuck_in_c_function" in x for x in names())
    finally:
        p.kill()  # the agent stops the job's workers when its launcher goes
        p.communicate(timeout=60)
