"""Identity is the key (issue 21, item 5), through a standing coordinator: a ddpctl client acts
only as the user its key maps to (ddp-coordinator --key-user), at the coordinator as at the
agents; its jobs reach the agents with the delegation its ddpctl signed (protocol version 6), and
run there as that key's user (agent.yaml key_users), while the coordinator's own key maps to
nobody; a forged, expired or replayed delegation is refused; allowed_users means the
authenticated user.

Everything on loopback in the root namespace: two throwaway users (useradd, removed at the end),
each with a token file of their own; ddpctl runs as them through setpriv, as on a login node; the
coordinator and the agent run as root, as under systemd. tests/integration/protoclient.py (a
second implementation of the protocol) says on the wire what ddpctl never would."""
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

import protoclient
from ddptest import BINARY_DIR, free_port, wait_listening, write_secret_file

AGENTD = str(BINARY_DIR / "bin" / "ddp-agentd")
COORDINATOR = str(BINARY_DIR / "bin" / "ddp-coordinator")
DDPCTL = str(BINARY_DIR / "bin" / "ddpctl")

WORKER = r'''
import json, os
print("ids", json.dumps({"uid": os.getuid(), "user": os.environ.get("USER"), "rank": int(os.environ["RANK"])}), flush=True)
'''


def needs():
    if os.geteuid() != 0:
        return "needs root (useradd, and an agent that switches users)"
    for tool in ("useradd", "userdel", "setpriv"):
        if not shutil.which(tool):
            return f"'{tool}' not found"
    return None




class User:
    def __init__(self, site, name, key_id):
        self.name, self.key_id, self.secret = name, key_id, os.urandom(32).hex()
        self.home = site.dir / f"home-{name}"

    def create(self):
        subprocess.run(["useradd", "-m", "-d", str(self.home), "-s", "/bin/sh", "-U", self.name], check=True,
                       capture_output=True)
        self.pw = pwd.getpwnam(self.name)
        self.token = self.home / "token"
        write_secret_file(self.token, f"{self.key_id}: {self.secret}\n", self.pw.pw_uid, self.pw.pw_gid)


class Site:
    """Users alice and bob, one agent, one standing coordinator, all on loopback."""

    def __init__(self):
        tag = f"{os.getpid() % 100000}"
        self.dir = Path(tempfile.mkdtemp(prefix="ddp-identity-", dir="/var/tmp"))
        os.chmod(self.dir, 0o755)
        self.alice = User(self, f"ddpa{tag}", "alice-key")
        self.bob = User(self, f"ddpb{tag}", "bob-key")
        self.coord_secret = os.urandom(32).hex()
        self.made = []
        self.procs = []
        self.agent_port, self.coord_port = free_port(), free_port()
        self.runtime = self.dir / "run"
        self.runtime.mkdir(mode=0o700)

    def setup(self):
        for u in (self.alice, self.bob):
            u.create()
            self.made.append(u.name)
        # The coordinator's first key proves it to the agent; it holds every user's key to check them.
        self.keys_text = (f"coord: {self.coord_secret}\n{self.alice.key_id}: {self.alice.secret}\n"
                          f"{self.bob.key_id}: {self.bob.secret}\n")
        self.daemon_token = self.dir / "daemon-token"
        write_secret_file(self.daemon_token, self.keys_text)
        # root, holding bob's key only (it could as well be bob's stolen file).
        self.root_with_bobs_key = self.dir / "root-bob-token"
        write_secret_file(self.root_with_bobs_key, f"{self.bob.key_id}: {self.bob.secret}\n")
        # alice, holding bob's key.
        self.alice_with_bobs_key = self.alice.home / "bobs-token"
        write_secret_file(self.alice_with_bobs_key, f"{self.bob.key_id}: {self.bob.secret}\n", self.alice.pw.pw_uid,
                          self.alice.pw.pw_gid)
        (self.dir / "worker.py").write_text(WORKER)
        (self.dir / "worker.py").chmod(0o644)

    def teardown(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(timeout=30)
        for name in self.made:
            subprocess.run(["userdel", name], capture_output=True)
            if subprocess.run(["getent", "group", name], capture_output=True).returncode == 0:
                subprocess.run(["groupdel", name], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, argv, port, log_name):
        log = self.dir / log_name
        p = subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                             env=dict(os.environ, XDG_RUNTIME_DIR=str(self.runtime)), cwd=self.dir)
        self.procs.append(p)
        wait_listening(port, p, log)
        return p

    def start_agent(self, config=""):
        cfg = self.dir / "agent.yaml"
        cfg.write_text(f'listen: "127.0.0.1:{self.agent_port}"\nkey_users:\n  {self.alice.key_id}: {self.alice.name}\n'
                       f'  {self.bob.key_id}: {self.bob.name}\n{config}')
        return self.start([AGENTD, "--config", str(cfg), "--token-file", str(self.daemon_token), "--log-dir",
                           str(self.dir / "agent-logs"), "-v"], self.agent_port, "agent.log")

    def start_coordinator(self, key_users=True):
        mapped = [f"--key-user={self.alice.key_id}={self.alice.name}", f"--key-user={self.bob.key_id}={self.bob.name}"]
        return self.start([COORDINATOR, "--listen", f"127.0.0.1:{self.coord_port}", "--token-file", str(self.daemon_token),
                           "--log-dir", str(self.dir / "coord-logs"), *(mapped if key_users else [])],
                          self.coord_port, "coordinator.log")

    def log(self, name):
        return (self.dir / name).read_text(errors="replace")

    def job(self, name, command=None):
        command = command or ["/usr/bin/python3", str(self.dir / "worker.py")]
        path = self.dir / f"{name}.yaml"
        path.write_text(f"name: {name}\nnproc_per_node: 1\ncommand: {json.dumps(command)}\nworkdir: {self.dir}\n"
                        f"store: {{port: {free_port()}}}\nstop: {{grace: 2s}}\n")
        path.chmod(0o644)
        return path

    def ddpctl(self, user, token, *args, timeout=120):
        """ddpctl ARGS run as `user` (a User, or None for root) with --token-file `token`."""
        argv = [DDPCTL, *args[:1], "--coordinator", f"127.0.0.1:{self.coord_port}", "--token-file", str(token), *args[1:]]
        env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
        cwd = self.dir
        if user:
            argv = ["setpriv", f"--reuid={user.pw.pw_uid}", f"--regid={user.pw.pw_gid}", "--init-groups", *argv]
            env.update(HOME=str(user.home), USER=user.name, LOGNAME=user.name)
            cwd = user.home
        return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)

    def launch(self, user, token, job, *args):
        return self.ddpctl(user, token, "launch", "--nodes", f"127.0.0.1:{self.agent_port}", *args, str(job))


def ids_of(stdout):
    return [json.loads(line.split("ids ", 1)[1]) for line in stdout.splitlines() if "ids {" in line]


@pytest.fixture
def site():
    reason = needs()
    if reason:
        pytest.skip(reason)
    s = Site()
    try:
        s.setup()
        yield s
    finally:
        s.teardown()


# Without --key-user too: the coordinator then takes the declared name, but the delegation binds
# the job to the key that signed it, and the agent maps that key itself.
@pytest.mark.parametrize("coordinator_key_users", [True, False])
def test_a_job_through_the_standing_coordinator_runs_as_its_submitters_user(site, coordinator_key_users):
    site.start_agent()
    site.start_coordinator(key_users=coordinator_key_users)
    for user in (site.alice, site.bob):
        r = site.launch(user, user.token, site.job(f"mine-{user.name}"))
        assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n{site.log('agent.log')}\n{site.log('coordinator.log')}"
        ids = ids_of(r.stdout)
        assert len(ids) == 1 and ids[0]["uid"] == user.pw.pw_uid and ids[0]["user"] == user.name, r.stdout
    # The coordinator's own key maps to nobody on the agent: the delegations made the users.
    assert f"runs as uid {site.alice.pw.pw_uid}" in site.log("agent.log")
    # The coordinator keeps each user's copy of the logs in a folder of their own.
    logs = site.dir / "coord-logs"
    for user in (site.alice, site.bob):
        assert list((logs / user.name).glob(f"mine-{user.name}*")), sorted(str(p) for p in logs.rglob("*"))
    assert not list(logs.glob("mine-*")), sorted(str(p) for p in logs.rglob("*"))


def test_a_client_acts_only_as_the_user_its_key_maps_to(site):
    site.start_agent()
    site.start_coordinator()
    marker = site.dir / "ran"
    # alice's account with bob's key: refused at the coordinator, before anything runs.
    r = site.launch(site.alice, site.alice_with_bobs_key, site.job("claim", ["/usr/bin/touch", str(marker)]))
    assert r.returncode != 0
    assert f"key 'bob-key' belongs to user '{site.bob.name}', but this client says it is '{site.alice.name}'" in r.stderr, \
        r.stderr
    # The same over version 5 (no delegation), by a client that names alice on the wire.
    c = protoclient.Client("127.0.0.1", site.coord_port, site.bob.key_id, site.bob.secret, role="ctl",
                           user=site.alice.name, version=5)
    answer = c.receive()
    assert answer["type"] == "error" and answer["code"] == "auth" and "belongs to user" in answer["message"], answer
    c.close()

    # alice's job runs; root with bob's key can neither stop nor see it, and neither can bob.
    r = site.launch(site.alice, site.alice.token, site.job("long", ["/bin/sleep", "600"]), "--detach", "--job-id",
                    "alice-long")
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n{site.log('coordinator.log')}"
    r = site.ddpctl(None, site.root_with_bobs_key, "stop", "alice-long")
    assert r.returncode != 0
    assert f"key 'bob-key' belongs to user '{site.bob.name}', but this client says it is 'root'" in r.stderr + r.stdout, \
        r.stderr + r.stdout
    for verb in ("stop", "status"):
        r = site.ddpctl(site.bob, site.bob.token, verb, "alice-long")
        assert r.returncode != 0 and "alice-long" in r.stderr + r.stdout, r.stderr + r.stdout
    r = site.ddpctl(site.alice, site.alice.token, "status", "--json", "alice-long")
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    st = json.loads(r.stdout)
    assert st["job_id"] == "alice-long" and len(st["ranks"]) == 1 and st["ranks"][0].get("pid"), st
    # ... and alice can.
    r = site.ddpctl(site.alice, site.alice.token, "stop", "alice-long")
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}"
    assert not marker.exists()
    # Ended, the job answers alice from its record; bob learns nothing of it, named or not.
    r = site.ddpctl(site.alice, site.alice.token, "status", "alice-long")
    assert r.returncode == 1 and "job alice-long ended" in r.stderr and "stopped" in r.stderr, r.stderr
    for args in (("status", "alice-long"), ("logs", "alice-long"), ("status",)):
        r = site.ddpctl(site.bob, site.bob.token, *args)
        assert r.returncode != 0 and "stopped" not in r.stderr + r.stdout, (args, r.stderr + r.stdout)
        assert "job alice-long ended" not in r.stderr + r.stdout, (args, r.stderr + r.stdout)


SPEC = {"file": "j.yaml", "name": "j", "nnodes_min": 1, "nnodes_max": 1, "nproc": {"kind": "count", "count": 1},
        "command": ["/bin/true"], "shell": False, "env": [], "env_forward": [], "max_restarts": 0,
        "restart_backoff_ms": 1000, "log_dir": "/var/tmp", "log_max_bytes": 1 << 20, "store_port": 29500,
        "nccl_unique_id": "off", "stop_grace_ms": 1000, "forward_env": {}, "workdir": "/",
        "binding": {"gpu": "auto", "numa": "auto", "nic": "auto"}}


def test_with_key_user_a_job_without_its_submitters_delegation_is_refused(site):
    # Without a delegation the agents would decide by the coordinator's own key; with --key-user
    # the coordinator runs only jobs their submitter signed (a version-5 ddpctl, or a modified one).
    site.start_agent()
    site.start_coordinator()
    marker = site.dir / "ran-undelegated"
    spec = dict(SPEC, command=["/usr/bin/touch", str(marker)])
    for version in (5, 6):
        c = protoclient.Client("127.0.0.1", site.coord_port, site.alice.key_id, site.alice.secret, role="ctl",
                               user=site.alice.name, version=version)
        try:
            c.send("submit", job_id=f"undelegated-{version}", user=site.alice.name, spec=spec,
                   nodes=[f"127.0.0.1:{site.agent_port}"])
            answer = c.receive()
        finally:
            c.close()
        assert answer["type"] == "error" and answer["code"] == "auth", answer
        assert "carries no delegation" in answer["message"], answer
    assert not marker.exists()


def offer(site, key_id, secret, job_id, delegation):
    """The agent's answer to a version-6 job_offer carrying `delegation`, over a link proving key_id."""
    c = protoclient.Client("127.0.0.1", site.agent_port, key_id, secret, role="coordinator", user=site.alice.name,
                           version=6)
    try:
        c.send("job_offer", t0_us=1, job_id=job_id, user=delegation["user"], node="n1", spec=SPEC, delegation=delegation)
        return c.receive()
    finally:
        c.close()


def test_the_agent_refuses_a_forged_expired_or_replayed_delegation(site):
    site.start_agent()
    now = int(time.time())
    a = site.alice

    def signed(**over):
        args = dict(key_id=a.key_id, secret=a.secret, user=a.name, coordinator_key="coord", job_id="j1",
                    expires_s=now + 600, spec=SPEC)
        args.update(over)
        return protoclient.delegation(**args)

    cases = [
        # bob signs a delegation that names alice's key and alice.
        ("forged", "coord", site.coord_secret, "j1", signed(secret=site.bob.secret), "does not verify with key 'alice-key'"),
        ("expired", "coord", site.coord_secret, "j1", signed(expires_s=now - 5), "delegation expired"),
        ("another job", "coord", site.coord_secret, "j2", signed(), "is for job j1, not j2"),
        ("another spec", "coord", site.coord_secret, "j1", signed(spec=dict(SPEC, command=["/bin/sh", "-c", "id"])),
         "another job spec"),
        # copied off the wire and offered over a link that proves bob's key, not the coordinator's.
        ("another link", "bob-key", site.bob.secret, "j1", signed(), "for a coordinator with key 'coord', not 'bob-key'"),
    ]
    for what, key_id, secret, job_id, d, why in cases:
        answer = offer(site, key_id, secret, job_id, d)
        assert answer["type"] == "error" and answer["code"] == "auth" and why in answer["message"], (what, answer)
    # A good one is taken: the agent joins, for alice.
    answer = offer(site, "coord", site.coord_secret, "j1", signed())
    assert answer["type"] == "join", answer
    assert f"job j1 offered by coordinator" in site.log("agent.log") and f"(runs as uid {a.pw.pw_uid})" in site.log("agent.log")


def test_allowed_users_is_the_authenticated_user(site):
    site.start_agent(f"allowed_users: [{site.alice.name}]\n")
    site.start_coordinator()
    r = site.launch(site.bob, site.bob.token, site.job("bobs"))
    assert r.returncode != 0
    assert f"does not accept jobs from user '{site.bob.name}'" in r.stderr, f"{r.stderr}\n{site.log('agent.log')}"
    assert "must hold the agent's secret" not in r.stderr, r.stderr  # a policy refusal, not a wrong token
    r = site.launch(site.alice, site.alice.token, site.job("alices"))
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n{site.log('agent.log')}"
    assert ids_of(r.stdout)[0]["uid"] == site.alice.pw.pw_uid
