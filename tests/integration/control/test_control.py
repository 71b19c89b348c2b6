"""`ddpctl status`, `logs [-f]` and `stop` from another process, against a job launched in the
foreground (its control socket). Every test uses a private XDG_RUNTIME_DIR, bounds its waits,
and stops what it started by pid."""
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

import re

from ddptest import DDPCTL, PYTHON, alive, launch, start_launch, wait_for, write_job

WORKER = r'''
import datetime, os, sys, time
rank = int(os.environ["RANK"])
print(f"PID {os.getpid()}", flush=True)
if rank == 1 and os.environ.get("WAIT_ON_STORE") == "1":
    import torch.distributed as d
    s = d.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False,
                   timeout=datetime.timedelta(seconds=300))
    print("waiting on the store", flush=True)
    s.wait(["nobody_sets_this"])
i = 0
while True:
    print(f"tick {i} rank {rank}", flush=True)
    i += 1
    time.sleep(0.1)
'''


# Ranks 0 and 1 take turns: each line is printed only once the other rank's line before it is in
# its log file, and the clock is past that line's time, so the files' times order them a, b, c, d.
PINGPONG = r'''
import datetime, os, sys, time
rank = int(os.environ["RANK"])
other = os.path.join(os.environ["LOGS"], f"rank-{1 - rank}.log")

def seen(word):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with open(other) as f:
                for line in f:
                    if line.rstrip("\n").endswith(" out| " + word):
                        t = datetime.datetime.strptime(line.split(" ")[0], "%Y-%m-%dT%H:%M:%S.%fZ")
                        return t.replace(tzinfo=datetime.timezone.utc)
        except FileNotFoundError:
            pass
        time.sleep(0.01)
    sys.exit(f"rank {rank}: {word} never came")

words = ["a", "b", "c", "d"]
for i, w in enumerate(words):
    if i % 2 != rank:
        continue
    if i:
        t = seen(words[i - 1]) + datetime.timedelta(milliseconds=5)
        while datetime.datetime.now(datetime.timezone.utc) <= t:
            time.sleep(0.001)
    print(w, flush=True)
if rank == 0:
    seen("d")
    sys.exit(3)
'''


@pytest.fixture
def rt(tmp_path):
    d = tmp_path / "rt"
    d.mkdir(mode=0o700)
    return d


def job_file(tmp_path, name="ctl", wait_on_store=False):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    return write_job(tmp_path, f"name: {name}\nnproc_per_node: 2\ncommand: [{PYTHON}, {worker}]\n"
                               f"env: {{WAIT_ON_STORE: '{1 if wait_on_store else 0}'}}\n"
                               "stop: {grace: 3s}\nnccl: {unique_id: off}\n", name=f"{name}.yaml")


def ctl_env(rt):
    """The control sockets' folder and the ended jobs' records, both the test's own."""
    return {"XDG_RUNTIME_DIR": str(rt), "XDG_STATE_HOME": str(rt / "state")}


def ctl(rt, *args, timeout=60):
    env = dict(os.environ, **ctl_env(rt))
    return subprocess.run([DDPCTL, *args], env=env, capture_output=True, text=True, timeout=timeout)


def status_json(rt, *job):
    r = ctl(rt, "status", "--json", *job)
    return json.loads(r.stdout) if r.returncode == 0 else None


def end(p, timeout=60):
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise AssertionError(f"ddpctl launch did not end within {timeout} s:\n{err}")
    return p.returncode, out, err


def test_status_logs_and_stop_from_another_process(tmp_path, rt):
    job = job_file(tmp_path, wait_on_store=True)
    p = start_launch(job, "-q", "--job-id", "ctl-1", env=ctl_env(rt))
    try:
        sock = rt / "ddpctl" / "ctl-1.sock"
        wait_for(sock.exists, timeout=30, what="the control socket")
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(rt / "ddpctl").st_mode) == 0o700

        # status: both ranks with their pids; rank 1 named as waiting in the store.
        def rank1_waits():
            s = status_json(rt)
            return s if s and any("nobody_sets_this" in w for w in s["store_waiters"]) else None
        wait_for(rank1_waits, timeout=90, what="rank 1 waiting on the store")
        s = rank1_waits()
        assert s["job_id"] == "ctl-1" and s["mode"] == "local" and s["pid"] == p.pid
        assert s["state"] == "running" and s["attempt"] == 0 and s["max_restarts"] == 0
        assert [r["rank"] for r in s["ranks"]] == [0, 1]
        pids = [r["pid"] for r in s["ranks"]]
        assert all(alive(pid) for pid in pids) and all(r["state"] == "running" for r in s["ranks"])
        assert all(r["last_output_age_s"] is not None and r["last_output_age_s"] >= 0 for r in s["ranks"])
        assert any("rank 1" in w and "nobody_sets_this" in w for w in s["store_waiters"]), s["store_waiters"]
        # Any beginning of its id names it.
        assert status_json(rt, "ctl")["job_id"] == "ctl-1"
        text = ctl(rt, "status")  # the only job: no id needed
        assert text.returncode == 0, text.stderr
        assert "job ctl-1 (local" in text.stdout and str(pids[0]) in text.stdout and str(pids[1]) in text.stdout
        assert "store waiters:" in text.stdout and "nobody_sets_this" in text.stdout

        # logs: the files so far, one rank only.
        r = ctl(rt, "logs", "--ranks", "0")
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0] == f"[0] PID {pids[0]}" and all(l.startswith("[0] ") for l in lines), lines[:5]
        assert "[0] tick 0 rank 0" in lines
        r = ctl(rt, "logs", "--timestamps", "--ranks", "0")
        assert r.returncode == 0, r.stderr
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \[0\] PID \d+", r.stdout.splitlines()[0]), r.stdout[:200]
        # a rank the job does not have: said, not an empty answer (or, with -f, a wait for ever)
        r = ctl(rt, "logs", "--ranks", "1,5")
        assert r.returncode != 0 and "the job has no rank 5 (it has ranks 0-1)" in r.stderr, r.stderr

        # logs -f: the file, then the live stream, every line exactly once and in order.
        env = dict(os.environ, **ctl_env(rt))
        f = subprocess.Popen([DDPCTL, "logs", "-f", "ctl-1", "--ranks", "0"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        try:
            first = f.stdout.readline()
            assert first == f"[0] PID {pids[0]}\n"
            want = len(lines) + 30  # past what the files held when we asked: live lines
            for i in range(want):
                assert f.stdout.readline() == f"[0] tick {i} rank 0\n", f"line {i} of the followed stream"
            # stop: as Ctrl-C would; returns when the job has ended.
            r = ctl(rt, "stop")
            assert r.returncode == 0, r.stderr
            assert "job ctl-1 has ended" in r.stderr
            rest, ferr = f.communicate(timeout=30)
            assert f.returncode == 0 and "ended (stopped)" in ferr, ferr
        finally:
            if f.poll() is None:
                f.kill()
                f.wait()
        rc, _, err = end(p)
        assert rc == 143, err
        assert "ddpctl stop (pid" in err and "stopping the job" in err, err
        assert not sock.exists(), "the control socket outlived its launcher"
        wait_for(lambda: not any(alive(pid) for pid in pids), timeout=15, what="the workers to be gone")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_several_jobs_are_listed_and_each_is_reached_by_id(tmp_path, rt):
    procs = [start_launch(job_file(tmp_path, name=n), "-q", "--job-id", n, env=ctl_env(rt))
             for n in ("ctl-a", "ctl-b")]
    try:
        for n in ("ctl-a", "ctl-b"):
            wait_for(lambda: status_json(rt, n) is not None, timeout=30, what=f"job {n}")
            # Its ranks have begun (ctl-a's rank 1 lines are read back after its stop below):
            # the control socket is there before the workers' Python has printed anything.
            wait_for(lambda: "tick 0 rank 1" in ctl(rt, "logs", "--ranks", "1", n).stdout, timeout=30,
                     what=f"job {n}'s rank 1 to print")
        r = ctl(rt, "status")
        assert r.returncode == 2 and "2 jobs are running; name one" in r.stderr, r.stderr
        assert "ctl-a" in r.stderr and "ctl-b" in r.stderr
        assert status_json(rt, "ctl-b")["pid"] == procs[1].pid
        assert ctl(rt, "stop", "ctl-a").returncode == 0
        assert end(procs[0])[0] == 143
        assert procs[1].poll() is None, "stopping one job stopped the other"
        assert status_json(rt)["job_id"] == "ctl-b"  # the only one left: found without its id
        assert ctl(rt, "stop").returncode == 0
        assert end(procs[1])[0] == 143
        r = ctl(rt, "status")
        assert r.returncode == 1 and "no job of yours is running; the last one: job ctl-b ended" in r.stderr, r.stderr
        r = ctl(rt, "logs", "nosuch")
        assert r.returncode == 1 and "job nosuch is not running here, and no job id here begins with it" in r.stderr
        assert "newest first: ctl-b, ctl-a)" in r.stderr, r.stderr
        # an ended job, named: how it ended and where its logs are; its last attempt's lines
        r = ctl(rt, "status", "ctl-a")
        assert r.returncode == 1 and "job ctl-a ended" in r.stderr and "(stopped, exit code 143)" in r.stderr, r.stderr
        assert f"logs: {tmp_path}/logs/ctl-a" in r.stderr, r.stderr
        r = ctl(rt, "logs", "--ranks", "1", "ctl-a")
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert "[1] tick 0 rank 1" in lines and all(l.startswith("[1] ") for l in lines), lines[:5]
        assert ctl(rt, "logs", "--ranks", "2", "ctl-a").returncode == 1
        r = ctl(rt, "stop", "ctl-b")
        assert r.returncode == 1 and "nothing to stop: job ctl-b ended" in r.stderr, r.stderr
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def the_guardians_record(rt, job, pid):
    """Waits for the end record a killed launcher's guardian leaves; checks it says the launcher
    died, in text and JSON; returns `status --json`'s result."""
    wait_for(lambda: "died while the job ran" in ctl(rt, "status", job).stderr, timeout=10,
             what="the end record the guardian leaves")
    r = ctl(rt, "status", "--json", job)
    assert r.returncode == 1, r.stderr
    record = json.loads(r.stdout)
    assert record["state"] == "ended" and record["status"] == "failed", record
    assert record["exit_code"] == -1 and record["message"].startswith(f"ddpctl (pid {pid}) died"), record
    return r


def test_a_killed_launchers_socket_is_taken_for_stale(tmp_path, rt):
    p = start_launch(job_file(tmp_path), "-q", "--job-id", "ctl-k", env=ctl_env(rt))
    try:
        wait_for(lambda: status_json(rt) is not None, timeout=30, what="the job")
        wait_for(lambda: "[1] tick 0 rank 1" in ctl(rt, "logs", "--ranks", "1").stdout.splitlines(), timeout=30,
                 what="rank 1's first line in its log")
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
        sock = rt / "ddpctl" / "ctl-k.sock"
        assert sock.exists()  # nobody removed it: the launcher had no chance
        r = ctl(rt, "status")
        assert r.returncode == 1 and "no job of yours is running" in r.stderr, r.stderr
        assert not sock.exists(), "a dead launcher's socket was left in place"
        # The attempt's guardian left the job's end record once it had killed the ranks: status
        # and logs still know the job, and say what happened to it.
        r = the_guardians_record(rt, "ctl-k", p.pid)
        assert "(failed: ddpctl (pid" in r.stderr, r.stderr
        r = ctl(rt, "logs", "--ranks", "1", "ctl-k")
        assert r.returncode == 0 and "[1] tick 0 rank 1" in r.stdout.splitlines(), (r.stdout[:300], r.stderr)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_a_launcher_killed_in_a_restarts_backoff_leaves_the_jobs_record(tmp_path, rt):
    # Attempt 0 fails; ddpctl waits out a long backoff and is SIGKILLed meanwhile. Nothing runs
    # then, but the job must stay known: its record, and the failed attempt's lines.
    worker = tmp_path / "fail.py"
    worker.write_text("print('first life', flush=True)\nraise SystemExit(3)\n")
    job = write_job(tmp_path, f"name: bk\nnproc_per_node: 1\ncommand: [{PYTHON}, {worker}]\n"
                              "restart: {max_restarts: 1, backoff: 60s}\nnccl: {unique_id: off}\n", name="bk.yaml")
    p = start_launch(job, "--job-id", "bk-1", env=ctl_env(rt))
    try:
        lines = []
        for line in p.stderr:  # bounded: without the kill, attempt 1 ends the launch after 60 s
            lines.append(line)
            if "restarting the job in" in line:
                break
        assert lines and "restarting the job in" in lines[-1], "".join(lines)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
        the_guardians_record(rt, "bk-1", p.pid)  # left by the stood-down guardian
        r = ctl(rt, "logs", "bk-1")
        assert r.returncode == 0 and "[0] first life" in r.stdout.splitlines(), (r.stdout[:300], r.stderr)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_a_restart_that_cannot_start_leaves_the_jobs_record_saying_why(tmp_path, rt):
    # Attempt 0 leaves a file where attempt 1's log folder goes: the restart cannot start. The
    # job must not vanish from `ddpctl status`: its record says why, with ddpctl's exit code.
    worker = tmp_path / "block.py"
    worker.write_text("import os\n"
                      f"open(os.path.join({str(tmp_path)!r}, 'logs', 'rf-1', 'attempt-1'), 'w').close()\n"
                      "raise SystemExit(3)\n")
    job = write_job(tmp_path, f"name: rf\nnproc_per_node: 1\ncommand: [{PYTHON}, {worker}]\n"
                              "restart: {max_restarts: 1, backoff: 0.1s}\nnccl: {unique_id: off}\n", name="rf.yaml")
    r = launch(job, "-q", "--job-id", "rf-1", env=ctl_env(rt))
    assert r.returncode == 2 and "cannot create the log directory" in r.stderr, r.stderr
    r = ctl(rt, "status", "rf-1")
    assert r.returncode == 1 and "(failed, exit code 2: cannot create the log directory" in r.stderr, r.stderr
    record = json.loads(ctl(rt, "status", "--json", "rf-1").stdout)
    assert record["status"] == "failed" and record["exit_code"] == 2, record
    assert "cannot create the log directory" in record["message"], record


def test_another_user_is_refused_even_with_the_socket_open(tmp_path):
    # A folder every user can traverse (pytest's tmp_path is private to root).
    rt = Path(tempfile.mkdtemp(prefix="ddp-ctl-", dir="/var/tmp"))
    p = start_launch(job_file(tmp_path), "-q", "--job-id", "ctl-u", env=ctl_env(rt))
    try:
        wait_for(lambda: status_json(rt) is not None, timeout=30, what="the job")
        sock = rt / "ddpctl" / "ctl-u.sock"
        # Open the folder and the socket to everyone: the peer-credential check still says no.
        os.chmod(rt / "ddpctl", 0o777)
        os.chmod(sock, 0o777)
        os.chmod(rt, 0o755)
        # It is answered at once, before it can ask anything.
        probe = ("import socket; s = socket.socket(socket.AF_UNIX); s.connect(%r); "
                 "print(s.makefile().readline(), end='')" % str(sock))
        r = subprocess.run([PYTHON, "-c", probe], capture_output=True, text=True, timeout=30,
                           preexec_fn=lambda: (os.setgid(65534), os.setuid(65534)))
        assert r.returncode == 0, r.stderr
        reply = json.loads(r.stdout)
        assert reply == {"ok": False, "error": "permission denied: not the job's user"}
        assert p.poll() is None, "a refused client stopped the job"
        os.chmod(rt / "ddpctl", 0o700)
        assert ctl(rt, "stop").returncode == 0
        assert end(p)[0] == 143
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        shutil.rmtree(rt, ignore_errors=True)


def test_logs_merge_the_ranks_by_time_and_default_to_the_last_ended_job(tmp_path, rt):
    worker = tmp_path / "pingpong.py"
    worker.write_text(PINGPONG)
    for job_id in ("pp-first-1", "pp-second-1"):
        job = write_job(tmp_path, f"name: pp\nnproc_per_node: 2\ncommand: [{PYTHON}, {worker}]\n"
                                  f"env: {{LOGS: '{tmp_path}/logs/{job_id}/attempt-0'}}\nnccl: {{unique_id: off}}\n",
                        name=f"{job_id}.yaml")
        r = launch(job, "-q", "--job-id", job_id, env=ctl_env(rt))
        assert r.returncode == 1 and "exited with code 3" in r.stderr, r.stderr
    # Nothing runs: the job that ended last, said first; its ranks' lines in the order they were written.
    r = ctl(rt, "logs")
    assert r.returncode == 0, r.stderr
    assert "no job of yours is running; the last one: job pp-second-1 ended" in r.stderr, r.stderr
    assert "(failed, exit code 1)" in r.stderr, r.stderr
    assert r.stdout.splitlines() == ["[0] a", "[1] b", "[0] c", "[1] d"], r.stdout
    # Any unique beginning of an id; --timestamps: each line's time, in order.
    r = ctl(rt, "logs", "--timestamps", "pp-f")
    assert r.returncode == 0 and "job pp-first-1 ended" in r.stderr, r.stderr
    lines = r.stdout.splitlines()
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
    assert all(re.fullmatch(stamp + r" \[[01]\] [abcd]", l) for l in lines), lines
    assert [l.split(" ", 1)[1] for l in lines] == ["[0] a", "[1] b", "[0] c", "[1] d"], lines
    times = [l.split(" ")[0] for l in lines]
    assert times == sorted(times) and len(set(times)) == 4, times
    r = ctl(rt, "status")
    assert r.returncode == 1 and "no job of yours is running; the last one: job pp-second-1 ended" in r.stderr, r.stderr
    # A beginning that fits several: each named, nothing chosen.
    r = ctl(rt, "status", "pp-")
    assert r.returncode == 2 and "'pp-' begins 2 job ids" in r.stderr, r.stderr
    assert "pp-first-1" in r.stderr and "pp-second-1" in r.stderr
    r = ctl(rt, "stop")
    assert r.returncode == 1 and "nothing to stop: no job of yours is running; the last one: job pp-second-1" in r.stderr


def test_logs_of_earlier_attempts(tmp_path, rt):
    # Attempt 0 fails and the job restarts: why it failed is in attempt 0's files, which `logs`
    # (the last attempt's) does not show. --attempt N shows one; all shows each in order.
    worker = tmp_path / "restarting.py"
    # Rank 0 fails attempt 0 only once rank 1 has printed (else rank 1 may be stopped first).
    worker.write_text("import os, sys, time\n"
                      "n, rank = int(os.environ['TORCHELASTIC_RESTART_COUNT']), os.environ['RANK']\n"
                      "print(f'attempt {n} rank {rank}', flush=True)\n"
                      f"open(f'{tmp_path}/printed-{{n}}-{{rank}}', 'w').close()\n"
                      "deadline = time.monotonic() + 60\n"
                      f"while n == 0 and rank == '0' and not os.path.exists(f'{tmp_path}/printed-0-1') "
                      "and time.monotonic() < deadline:\n"
                      "    time.sleep(0.01)\n"
                      "sys.exit(3 if n == 0 and rank == '0' else 0)\n")
    job = write_job(tmp_path, f"nproc_per_node: 2\ncommand: [{PYTHON}, {worker}]\nnccl: {{unique_id: off}}\n"
                              "restart: {max_restarts: 1, backoff: 10ms}\n", name="rs.yaml")
    r = launch(job, "-q", "--job-id", "rs-1", env=ctl_env(rt))
    assert r.returncode == 0, r.stderr
    r = ctl(rt, "logs", "rs-1")
    assert r.returncode == 0 and sorted(r.stdout.splitlines()) == ["[0] attempt 1 rank 0", "[1] attempt 1 rank 1"]
    r = ctl(rt, "logs", "--attempt", "0", "--ranks", "1", "rs-1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["[1] attempt 0 rank 1"], r.stdout
    assert "job rs-1, attempt 0\n" in r.stderr, r.stderr
    r = ctl(rt, "logs", "--attempt", "all", "rs-1")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert sorted(lines[:2]) == ["[0] attempt 0 rank 0", "[1] attempt 0 rank 1"], lines
    assert sorted(lines[2:]) == ["[0] attempt 1 rank 0", "[1] attempt 1 rank 1"], lines
    assert "job rs-1, attempt 1 (the last)" in r.stderr, r.stderr
    r = ctl(rt, "logs", "--attempt", "2", "rs-1")
    assert r.returncode == 1 and "job rs-1 has no attempt 2 (it has attempts 0-1)" in r.stderr, r.stderr
    r = ctl(rt, "logs", "--attempt", "0", "--ranks", "5", "rs-1")
    assert r.returncode == 1 and "attempt 0: no log file of rank 5 (there are ranks 0,1)" in r.stderr, r.stderr
    r = ctl(rt, "logs", "--attempt", "0", "-f", "rs-1")
    assert r.returncode == 2 and "--follow" in r.stderr, r.stderr
    r = ctl(rt, "logs", "--attempt", "", "rs-1")  # not taken for "the last attempt"
    assert r.returncode == 2 and "expected an attempt number (0 is the first) or all, got ''" in r.stderr, r.stderr


def test_local_detach_names_a_way_that_works(tmp_path, rt):
    job = job_file(tmp_path, name="det")
    r = launch(job, "--detach", env=ctl_env(rt))
    assert r.returncode == 2, r.stderr
    hint = "`setsid -f ddpctl launch ARGS >job.out 2>&1 </dev/null` (your arguments less --detach)"
    assert "--detach needs --nodes" in r.stderr and hint in r.stderr, r.stderr
    # What it says, done: the job runs without us, and status/stop reach it.
    cmd = f"setsid -f {DDPCTL} launch {job} --master-port 0 --job-id det-1 >job.out 2>&1 </dev/null"
    subprocess.run(["sh", "-c", cmd], cwd=tmp_path, env=dict(os.environ, **ctl_env(rt)), check=True, timeout=30)
    pid = None
    try:
        wait_for(lambda: status_json(rt, "det-1") is not None, timeout=60, what="the detached job")
        pid = status_json(rt, "det-1")["pid"]
        r = ctl(rt, "stop", "det")
        assert r.returncode == 0 and "job det-1 has ended" in r.stderr, r.stderr
        wait_for(lambda: not alive(pid), timeout=30, what="the detached launcher to exit")
    finally:
        if pid and alive(pid):
            os.kill(pid, signal.SIGKILL)


# A rank that leaves a symbolic link where its log file was (to a file of log lines it could not
# read itself, were `ddpctl logs` root's and the job another user's).
LINKER = r'''
import os
logs = os.environ["LOGS"]
print("mine", flush=True)
os.unlink(os.path.join(logs, "rank-0.log"))
os.symlink(os.environ["SECRET"], os.path.join(logs, "rank-0.log"))
'''


def test_logs_follow_no_link_the_job_left_in_its_log_folder(tmp_path, rt):
    secret = tmp_path / "secret"
    secret.write_text("2026-12-04T10:00:00.000Z out| the secret\n")
    worker = tmp_path / "linker.py"
    worker.write_text(LINKER)
    job = write_job(tmp_path, f"name: ln\nnproc_per_node: 1\ncommand: [{PYTHON}, {worker}]\n"
                              f"env: {{LOGS: '{tmp_path}/logs/ln-1/attempt-0', SECRET: '{secret}'}}\n"
                              "nccl: {unique_id: off}\n", name="ln.yaml")
    r = launch(job, "-q", "--job-id", "ln-1", env=ctl_env(rt))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "logs/ln-1/attempt-0/rank-0.log").is_symlink()
    r = ctl(rt, "logs", "ln-1")
    assert r.returncode == 0, r.stderr
    assert "the secret" not in r.stdout, r.stdout
    assert (f"ddpctl logs: rank 0: cannot read {tmp_path}/logs/ln-1/attempt-0/rank-0.log: it is a symbolic link, "
            "which is not followed here") in r.stderr, r.stderr
