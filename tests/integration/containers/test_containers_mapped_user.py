"""A mapped user's container job (agent.yaml key_users) on a root agent with real podman: the
worker runs as the job's uid inside, with no capabilities and no way to gain one; a mount of a
path the user cannot read, and runtime flags of the job's own (extra_args), are refused before
anything runs.

A throwaway user (useradd, removed at the end) launches through setpriv as on a login node; the
agent on loopback holds the user's key mapped to it. Podman's private store is made as in
test_containers.py."""
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from ddptest import BINARY_DIR, DDPCTL, free_port, wait_for, write_secret_file
from test_containers import BUSYBOX, IMAGE, PODMAN, drop_podman_store, make_podman_store

AGENTD = str(BINARY_DIR / "bin" / "ddp-agentd")

pytestmark = [
    pytest.mark.skipif(PODMAN is None, reason="podman is not installed (scripts/setup installs it)"),
    pytest.mark.skipif(BUSYBOX is None, reason="busybox is not installed (scripts/setup installs busybox-static)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="rootful podman and useradd need root"),
    pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv not found"),
]



@pytest.fixture
def setup(tmp_path_factory):
    podman_env = make_podman_store(tmp_path_factory.mktemp("podman"))
    user = f"ddpc{os.getpid() % 100000}"
    base = Path(tempfile.mkdtemp(prefix="ddp-ctr-user-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    agent = None
    made_user = False
    try:
        subprocess.run(["useradd", "-M", "-d", str(base / "home"), "-s", "/bin/sh", "-U", user], check=True,
                       capture_output=True)
        made_user = True
        pw = pwd.getpwnam(user)
        home = base / "home"
        home.mkdir()
        os.chown(home, pw.pw_uid, pw.pw_gid)
        secret = os.urandom(32).hex()
        write_secret_file(base / "agent-token", f"u-key: {secret}\n")
        write_secret_file(home / "token", f"u-key: {secret}\n", pw.pw_uid, pw.pw_gid)
        port = free_port()
        (base / "agent.yaml").write_text(f'listen: "127.0.0.1:{port}"\nkey_users:\n  u-key: {user}\n')
        log = base / "agent.log"
        with open(log, "w") as out:
            # The agent's environment names podman's private store: root's runtime uses it.
            agent = subprocess.Popen([AGENTD, "--config", str(base / "agent.yaml"), "--token-file", str(base / "agent-token"),
                                      "--log-dir", str(base / "agent-logs"), "-v"],
                                     stdout=out, stderr=subprocess.STDOUT, env=podman_env)

        def listening():
            assert agent.poll() is None, log.read_text()
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0
        wait_for(listening, 30, "the agent to listen")
        yield dict(user=user, pw=pw, home=home, base=base, port=port, log=log, podman_env=podman_env)
    finally:
        if agent and agent.poll() is None:
            agent.send_signal(signal.SIGTERM)
            try:
                agent.wait(timeout=60)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait(timeout=30)
        drop_podman_store(podman_env)
        if made_user:
            subprocess.run(["userdel", user], capture_output=True)
            if subprocess.run(["getent", "group", user], capture_output=True).returncode == 0:
                subprocess.run(["groupdel", user], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def job_in(s, name, command, mounts='["./:/work"]', extra=""):
    """A job folder of the user's, holding its job file; in root's folder, so that the user cannot
    swap it for a link before the runtime mounts it (a mount source's folders above it must be ones
    the user cannot change)."""
    d = s["base"] / name
    d.mkdir()
    os.chown(d, s["pw"].pw_uid, s["pw"].pw_gid)
    job = d / "job.yaml"
    job.write_text(f"""name: {name}
nproc_per_node: 2
command: {command}
workdir: {d}
stop: {{grace: 3s}}
container:
  runtime: podman
  image: {IMAGE}
  pull: never
  mounts: {mounts}
  workdir: /work
{extra}""")
    os.chown(job, s["pw"].pw_uid, s["pw"].pw_gid)
    return d, job


def launch_as_user(s, job):
    pw = s["pw"]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(s["home"]), "USER": s["user"], "LOGNAME": s["user"]}
    # A store port of its own: the default 29500 may be another test's at the same moment.
    return subprocess.run(["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups", DDPCTL, "launch",
                           "--nodes", f"127.0.0.1:{s['port']}", "--token-file", str(s["home"] / "token"),
                           "--master-port", str(free_port()), str(job)],
                          cwd=job.parent, env=env, capture_output=True, text=True, timeout=300)


def test_the_worker_runs_as_the_jobs_user_inside_without_privileges(setup):
    s = setup
    d, job = job_in(s, "whoami", """[/bin/sh, -c, 'grep -E "^(Uid|Gid|CapEff|CapBnd|NoNewPrivs):" /proc/self/status > /work/status-$RANK.txt']""")
    r = launch_as_user(s, job)
    assert r.returncode == 0, f"{r.stdout}\n{r.stderr}\n{s['log'].read_text()}"
    uid, gid = s["pw"].pw_uid, s["pw"].pw_gid
    for rank in range(2):
        status = dict(line.split(":", 1) for line in (d / f"status-{rank}.txt").read_text().splitlines())
        assert status["Uid"].split() == [str(uid)] * 4, status
        assert status["Gid"].split() == [str(gid)] * 4, status
        assert int(status["CapEff"], 16) == 0 and int(status["CapBnd"], 16) == 0, status
        assert status["NoNewPrivs"].strip() == "1", status
        # Written through the mount by the user's uid, not root's.
        assert (d / f"status-{rank}.txt").stat().st_uid == uid
    # The env files (the worker's environment) went to root's folder, not the user's attempt folder.
    assert not list((s["base"] / "agent-logs").glob("whoami*/**/*.env"))


def test_a_mount_the_user_cannot_read_is_refused_before_anything_runs(setup):
    s = setup
    private = s["base"] / "root-only"
    private.mkdir(mode=0o700)
    (private / "secret").write_text("root's\n")
    (private / "secret").chmod(0o644)  # readable, but only through a folder the user cannot enter
    d, job = job_in(s, "private", "[/bin/sh, -c, 'cat /secret/secret > /work/leaked; touch /work/ran']",
                    mounts=f'["./:/work", "{private}:/secret:ro"]')
    r = launch_as_user(s, job)
    assert r.returncode != 0
    assert f"user {s['user']} cannot read container mount source {private}" in r.stderr, r.stderr
    assert not (d / "ran").exists() and not (d / "leaked").exists()
    # A link of the user's to it is the same path to the kernel: refused too.
    link = d / "link"
    link.symlink_to(private)
    os.lchown(link, s["pw"].pw_uid, s["pw"].pw_gid)
    d2, job2 = job_in(s, "vialink", "[/bin/sh, -c, 'touch /work/ran']", mounts=f'["./:/work", "{link}:/secret"]')
    r = launch_as_user(s, job2)
    assert r.returncode != 0
    assert f"user {s['user']} cannot read container mount source {link}" in r.stderr, r.stderr
    assert not (d2 / "ran").exists()
    assert not [l for l in (s["base"] / "agent-logs").rglob("rank-*.log")]


def test_a_mount_in_a_folder_the_user_can_change_is_refused(setup):
    # /home/u/data passes a check as the user, but the user could rename it and leave a link to
    # a folder of another user's in its place before root's runtime resolves the path again.
    s = setup
    data = s["home"] / "data"
    data.mkdir()
    os.chown(data, s["pw"].pw_uid, s["pw"].pw_gid)
    d, job = job_in(s, "inhome", "[/bin/sh, -c, 'touch /work/ran']", mounts=f'["./:/work", "{data}:/data"]')
    r = launch_as_user(s, job)
    assert r.returncode != 0
    assert (f"container mount source {data} lies in {s['home']}, which user {s['user']} can change") in r.stderr, r.stderr
    assert not (d / "ran").exists()


def test_root_flags_and_other_runtimes_are_refused(setup):
    s = setup
    d, job = job_in(s, "priv", "[/bin/sh, -c, 'touch /work/ran']", extra="  extra_args: [--privileged]\n")
    r = launch_as_user(s, job)
    assert r.returncode != 0
    assert "container.extra_args (--privileged) are not allowed for a mapped user's container" in r.stderr, r.stderr
    assert not (d / "ran").exists()
