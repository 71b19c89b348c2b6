"""A root agent's files versus the jobs it runs for mapped users (key_users, job_units: fork):
nothing a job can write may make the root shepherd write, give away or read a file of root's,
and one user's job id never reaches another user's logs (issue 21, items 1, 2 and 6's files).

Each attack is made by the job's own workers, as an attacker holding only a mapped key would:
they put a symbolic link (or a folder) where the shepherd expects a log or error file. The
target is a 0600 file of root's that this test makes in its own folder (never a real system
file); it must keep its owner and content, and its content must never reach the launcher.

A local agent on loopback (the network rule); throwaway users made with useradd and removed at
the end; the launchers run as those users through setpriv (test_run_as_user.py's Node)."""
import json
import os
import subprocess
from pathlib import Path

import pytest

from ddptest import free_port
from test_run_as_user import DDPCTL, Node, needs, write_secret_file

# What each worker does, by its first argument; the second is root's file.
WORKER = r'''
import os, sys
mode, victim = sys.argv[1], sys.argv[2]
err = os.environ["TORCHELASTIC_ERROR_FILE"]
attempt = os.path.dirname(err)
log = os.path.join(attempt, "rank-%s.log" % os.environ["RANK"])
if mode == "link-log":        # for the next job (or attempt) that opens this name
    os.unlink(log)
    os.symlink(victim, log)
    print("linked", log, flush=True)
elif mode == "premake-attempt":  # the next attempt's folder, made by the job, with a link in it
    nxt = os.path.join(os.path.dirname(attempt), "attempt-%d" % (int(os.environ["TORCHELASTIC_RESTART_COUNT"]) + 1))
    try:
        os.mkdir(nxt)
        os.symlink(victim, os.path.join(nxt, "rank-0.log"))
        print("premade", nxt, flush=True)
    except OSError as e:
        print("cannot premake", nxt, e, flush=True)
    sys.exit(0 if os.environ["TORCHELASTIC_RESTART_COUNT"] != "0" else 1)
elif mode == "rotate":         # rotation's rename cannot replace a folder: a reopen by name follows the link
    os.mkdir(log + ".1")
    open(os.path.join(log + ".1", "keep"), "w").close()
    os.unlink(log)
    os.symlink(victim, log)
    for i in range(100):
        print("x" * 200, flush=True)
elif mode == "error-file":
    os.symlink(victim, err)
    sys.exit(3)
else:
    print("output of", os.environ["USER"], flush=True)
'''

SECRET = "root-secret-" + os.urandom(8).hex()


class TwoUsers(Node):
    """test_run_as_user's Node, plus a second user with its own key, and root's victim file."""

    def setup(self):
        super().setup()
        tag = f"{os.getpid() % 100000}"
        self.user2 = f"ddpv{tag}"
        self.home2 = self.dir / "home2"
        subprocess.run(["useradd", "-m", "-d", str(self.home2), "-s", "/bin/sh", "-U", self.user2], check=True,
                       capture_output=True)
        self.made_user2 = True
        import pwd
        self.pw2 = pwd.getpwnam(self.user2)
        self.user2_secret = os.urandom(32).hex()
        write_secret_file(self.agent_token, f"u-key: {self.user_secret}\nv-key: {self.user2_secret}\n"
                                            f"root-key: {self.root_secret}\n")
        self.user2_token = self.home2 / "token"
        write_secret_file(self.user2_token, f"v-key: {self.user2_secret}\n", self.pw2.pw_uid, self.pw2.pw_gid)
        (self.dir / "attack.py").write_text(WORKER)
        (self.dir / "attack.py").chmod(0o644)
        self.victim = self.dir / "victim"
        write_secret_file(self.victim, SECRET + "\n")

    def teardown(self):
        self.stop_agent()
        if getattr(self, "made_user2", False):
            subprocess.run(["userdel", self.user2], capture_output=True)
            if subprocess.run(["getent", "group", self.user2], capture_output=True).returncode == 0:
                subprocess.run(["groupdel", self.user2], capture_output=True)
        super().teardown()

    def start(self):
        self.start_agent(f"job_units: fork\nkey_users:\n  u-key: {self.user}\n  v-key: {self.user2}\n")
        self.wait_listening()

    def attack_job(self, name, mode, extra=""):
        path = self.dir / f"{name}.yaml"
        path.write_text(f"name: {name}\ncommand: [/usr/bin/python3, {self.dir}/attack.py, {mode}, {self.victim}]\n"
                        f"nproc_per_node: 1\nworkdir: {self.dir}\nstore: {{port: {free_port()}}}\n{extra}")
        path.chmod(0o644)
        return path

    def run_as(self, second, job, job_id, *extra):
        pw, home, token = (self.pw2, self.home2, self.user2_token) if second else (self.pw, self.home, self.user_token)
        argv = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups", DDPCTL, "launch",
                "--nodes", f"127.0.0.1:{self.port}", "--token-file", str(token), "--job-id", job_id, *extra, str(job)]
        env = dict(os.environ, HOME=str(home), USER=pw.pw_name, LOGNAME=pw.pw_name)
        for k in ("XDG_RUNTIME_DIR", "XDG_CONFIG_HOME", "XDG_STATE_HOME"):
            env.pop(k, None)
        return subprocess.run(argv, cwd=home, env=env, capture_output=True, text=True, timeout=180)

    def victim_untouched(self, *outputs):
        st = os.stat(self.victim)
        assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (0, 0, 0o600), (st.st_uid, oct(st.st_mode))
        assert self.victim.read_text() == SECRET + "\n"
        for text in outputs:
            assert SECRET not in text
        assert SECRET not in self.agent_log.read_text()

    def said(self, r):
        return f"rc={r.returncode}\n{r.stdout}\n{r.stderr}\n--- agent:\n{self.agent_log.read_text()}"


@pytest.fixture
def node():
    reason = needs()
    if reason:
        pytest.skip(reason)
    n = TwoUsers()
    try:
        n.setup()
        n.start()
        yield n
    finally:
        n.teardown()


def test_a_reused_job_id_cannot_make_root_append_to_and_give_away_a_linked_file(node):
    # The first job leaves a link where its rank log was; the same id again used to open that
    # name as root with append, then chown it to the job's user. Within the agent's life the id
    # continues in its folder, where the link is refused, not followed.
    r = node.run_as(False, node.attack_job("linklog", "link-log"), "reuse-1")
    assert r.returncode == 0, node.said(r)
    assert "linked" in r.stdout, node.said(r)
    r = node.run_as(False, node.attack_job("linklog", "print"), "reuse-1")
    node.victim_untouched(r.stdout, r.stderr)
    assert r.returncode != 0, node.said(r)
    assert "rank 0 not started: cannot write its log file" in r.stderr, node.said(r)
    assert "symbolic link" in r.stderr, node.said(r)
    assert "output of" not in r.stdout, node.said(r)


def test_a_job_id_used_before_the_agent_started_is_refused(node):
    r = node.run_as(False, node.attack_job("linklog", "link-log"), "reuse-2")
    assert r.returncode == 0, node.said(r)
    node.stop_agent()
    node.start()
    r = node.run_as(False, node.attack_job("linklog", "print"), "reuse-2")
    node.victim_untouched(r.stdout, r.stderr)
    # Refused before any rank runs, saying why and what to do.
    assert r.returncode != 0, node.said(r)
    assert "attempt-0 exists already, and this agent did not make it: job id 'reuse-2' was used" in r.stderr, node.said(r)
    assert "another --job-id" in r.stderr, node.said(r)
    assert "output of" not in r.stdout, node.said(r)


def test_log_rotation_never_reopens_a_name_the_job_swapped(node):
    r = node.run_as(False, node.attack_job("rotate", "rotate", "logs: {max_size: 4KiB}\n"), "rot-1")
    node.victim_untouched(r.stdout, r.stderr)
    # The log says why it stopped; the job's own output still reached the launcher.
    assert r.stdout.count("x" * 200) == 100, node.said(r)
    # The link and the folder are left as the job made them: moved or followed, never.
    attempt = node.log_dir / node.user / "rot-1" / "attempt-0"
    assert os.path.islink(attempt / "rank-0.log") and os.path.isdir(attempt / "rank-0.log.1")


def test_an_error_file_linked_to_a_root_file_is_not_read(node):
    result = node.home / "result.json"
    r = node.run_as(False, node.attack_job("errfile", "error-file"), "err-1", "--result-json", str(result))
    assert r.returncode != 0, node.said(r)
    text = result.read_text()
    node.victim_untouched(r.stdout, r.stderr, text)
    failure = json.loads(text)
    assert "error file not read: it is a symbolic link" in json.dumps(failure), text
    assert "error file not read: it is a symbolic link" in r.stderr, node.said(r)


def test_a_job_id_of_another_user_reaches_none_of_their_logs(node):
    r = node.run_as(False, node.attack_job("shared", "print"), "shared-1")
    assert r.returncode == 0, node.said(r)
    r2 = node.run_as(True, node.attack_job("shared", "print"), "shared-1")
    assert r2.returncode == 0, node.said(r2)
    first = node.log_dir / node.user / "shared-1" / "attempt-0" / "rank-0.log"
    second = node.log_dir / node.user2 / "shared-1" / "attempt-0" / "rank-0.log"
    assert os.stat(first).st_uid == node.pw.pw_uid
    assert f"output of {node.user}" in first.read_text() and node.user2 not in first.read_text()
    assert os.stat(second).st_uid == node.pw2.pw_uid
    assert f"output of {node.user2}" in second.read_text()
    # Neither user can enter the other's folder.
    for d, uid in ((node.log_dir / node.user, node.pw.pw_uid), (node.log_dir / node.user2, node.pw2.pw_uid)):
        st = os.stat(d)
        assert (st.st_uid, st.st_mode & 0o777) == (uid, 0o700), (d, st.st_uid, oct(st.st_mode))


def test_log_folders_and_files_are_the_users_alone(node):
    r = node.run_as(False, node.attack_job("modes", "print", f"logs: {{dir: {node.home}/logs}}\n"), "modes-1")
    assert r.returncode == 0, node.said(r)
    job = node.log_dir / node.user / "modes-1"
    for d in (node.log_dir / node.user, job, job / "attempt-0"):
        st = os.stat(d)
        assert (st.st_uid, st.st_mode & 0o777) == (node.pw.pw_uid, 0o700), (d, st.st_uid, oct(st.st_mode))
    st = os.stat(job / "attempt-0" / "rank-0.log")
    assert (st.st_uid, st.st_mode & 0o777) == (node.pw.pw_uid, 0o600), (st.st_uid, oct(st.st_mode))
    # The launcher's copy (under the submitter's logs.dir) is as private.
    copy = node.home / "logs" / "modes-1"
    for d in (copy, copy / "attempt-0"):
        assert os.stat(d).st_mode & 0o777 == 0o700, (d, oct(os.stat(d).st_mode))
    for f in (copy / "attempt-0" / "rank-0.log", copy / "result.json"):
        if f.exists():
            assert os.stat(f).st_mode & 0o777 == 0o600, (f, oct(os.stat(f).st_mode))
    assert (copy / "attempt-0" / "rank-0.log").exists()


def test_an_attempt_folder_the_job_made_ahead_is_refused(node):
    # The job folder is the user's (so they can remove their own logs): attempt 0 can make
    # attempt-1 with a link in it. The restart must not use it.
    r = node.run_as(False, node.attack_job("premake", "premake-attempt", "restart: {max_restarts: 1, backoff: 1s}\n"),
                    "pre-1")
    node.victim_untouched(r.stdout, r.stderr)
    assert "premade" in r.stdout, node.said(r)
    assert r.returncode != 0, node.said(r)
    assert "attempt-1 exists already" in r.stderr, node.said(r)
