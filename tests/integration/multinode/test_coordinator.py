"""A standing coordinator and detached launches (issue 5): ddp-coordinator on a host of its own
(n3), agents on n1 and n2, ddpctl in the launcher's namespace (simcluster.py has the rules).

What a user checks: a job submitted with --coordinator streams its output and ends with its
result as ddpctl's exit status; it keeps running when that ddpctl is killed, and another ddpctl
sees it (status, logs) and stops it; --detach returns with the job id, with or without a standing
coordinator, and status/logs -f/stop reach the job; nothing is left on the nodes afterwards.
"""
import json
import os
import re
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import simcluster  # noqa: E402
from ddptest import alive, wait_for  # noqa: E402
from simcluster import finish  # noqa: E402

SKIP = simcluster.netns_unavailable()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

PY = "/usr/bin/python3"
COORD_PORT = 29411

WORKER = r'''
import os, sys, time
rank = int(os.environ["RANK"])
print(f"hello from rank {rank} of {os.environ['WORLD_SIZE']} pid {os.getpid()}", flush=True)
mode = sys.argv[1]
if mode == "fail" and rank == 3:
    time.sleep(0.5)
    print("rank 3 gives up", file=sys.stderr, flush=True)
    sys.exit(7)
if mode == "fail-on-flag" and rank == 3 and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    while not os.path.exists(os.environ["FLAG"]):
        time.sleep(0.1)
    print("rank 3 gives up on the flag", file=sys.stderr, flush=True)
    sys.exit(7)
if mode in ("tick", "fail", "fail-on-flag"):
    for i in range(600):
        print(f"tick {i} rank {rank}", flush=True)
        time.sleep(0.5)
'''


@pytest.fixture
def cluster():
    with simcluster.Cluster(nodes=3) as c:
        c.nodes = c.hosts[:2]
        c.co = c.hosts[2]
        for h in c.nodes:
            c.start_agent(h)
        yield c


def start_coordinator(c):
    log = open(os.path.join(c.dir, "coordinator.log"), "ab")
    p = c.co.popen([os.path.join(c.bin, "ddp-coordinator"), "--listen", f"{c.co.addr}:{COORD_PORT}", "--token-file", c.token,
                    "--log-dir", "/tmp/coord-logs"], stdout=log, stderr=subprocess.STDOUT)
    c.wait_listening(c.co, port=COORD_PORT)
    return p


def coordinator_log(c):
    with open(os.path.join(c.dir, "coordinator.log"), errors="replace") as f:
        return f.read()


def job(c, name, mode):
    worker = c.write("worker.py", WORKER)
    return c.write(f"{name}.yaml", f"name: {name}\nnproc_per_node: 2\ncommand: {json.dumps([PY, worker, mode])}\n"
                                   "store: {port: 29500}\nstop: {grace: 3s}\n")


def runtime_env(c):
    """Each command on a simulated host gets a /tmp of its own: the control sockets go to a folder they share."""
    d = os.path.join(c.dir, "run")
    os.makedirs(d, mode=0o700, exist_ok=True)
    return ["env", f"XDG_RUNTIME_DIR={d}"]


def ddpctl(c, *args, timeout=60):
    """A ddpctl command run to its end in the launcher's namespace."""
    return c.ctl.run([*runtime_env(c), os.path.join(c.bin, "ddpctl"), *args], timeout=timeout, cwd=c.dir)


def submit(c, job_file, *args):
    argv = [os.path.join(c.bin, "ddpctl"), "launch", "--coordinator", f"{c.co.addr}:{COORD_PORT}", "--nodes",
            c.nodes_arg(c.nodes), "--token-file", c.token, *args, job_file]
    return c.ctl.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=c.dir)


def read_until(p, pattern, timeout=60):
    """ddpctl's stdout lines until one matches; returns them all."""
    lines = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        lines.append(line)
        if re.search(pattern, line):
            return lines
    raise AssertionError(f"no line matching {pattern!r} within {timeout} s:\n{''.join(lines)}")


def worker_pids(text):
    return sorted({int(m) for m in re.findall(r"hello from rank \d+ of \d+ pid (\d+)", text)})


def wait_gone(pids, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def status(c, job_id, *via):
    r = ddpctl(c, "status", "--json", *via, job_id)
    return r.returncode, (json.loads(r.stdout) if r.returncode == 0 else None), r.stderr


def via_coordinator(c):
    return ["--coordinator", f"{c.co.addr}:{COORD_PORT}", "--token-file", c.token]


def test_job_on_a_standing_coordinator_streams_and_returns_its_result(cluster):
    c = cluster
    start_coordinator(c)
    result = os.path.join(c.dir, "r.json")
    rc, out, err = finish(submit(c, job(c, "once", "once"), "--job-id", "once-1", "--result-json", result))
    assert rc == 0, out + err + coordinator_log(c)
    lines = set(out.splitlines())
    n1, n2 = c.nodes
    for rank in range(4):
        host = n1 if rank < 2 else n2
        assert any(l.startswith(f"[{host.addr}:{rank}] hello from rank {rank} of 4") for l in lines), out
    r = json.load(open(result))
    assert r["status"] == "succeeded" and r["exit_code"] == 0 and r["job_id"] == "once-1"
    assert "once-1" in coordinator_log(c)

    # A failing rank: the report on our stderr, exit 1, nothing left on the nodes.
    rc, out, err = finish(submit(c, job(c, "fail", "fail"), "--job-id", "fail-1"))
    assert rc == 1, out + err
    assert f"first failure: rank 3 (local rank 1, node {n2.addr}" in err, err
    assert "rank 3 gives up" in err, err
    assert len(worker_pids(out)) == 4 and wait_gone(worker_pids(out)) == []


def test_job_outlives_its_submitter_and_another_ddpctl_stops_it(cluster):
    c = cluster
    start_coordinator(c)
    p = submit(c, job(c, "long", "tick"), "--job-id", "long-1")
    seen = read_until(p, r"\] tick 2 rank 3$")
    pids = worker_pids("".join(seen))
    p.kill()  # SIGKILL: the job must not notice
    p.wait(timeout=10)

    rc, st, err = status(c, "long-1", *via_coordinator(c))
    assert rc == 0, err + coordinator_log(c)
    assert st["job_id"] == "long-1" and [r["rank"] for r in st["ranks"]] == [0, 1, 2, 3]
    assert all(alive(pid) for pid in pids)

    r = ddpctl(c, "logs", *via_coordinator(c), "--ranks", "3", "long-1")
    assert r.returncode == 0, r.stderr
    assert "[3] hello from rank 3 of 4" in r.stdout and "[3] tick 2 rank 3" in r.stdout, r.stdout
    assert "[0] " not in r.stdout

    # ddpctl stacks through the standing coordinator: every rank, named with its node.
    r = ddpctl(c, "stacks", *via_coordinator(c), "--json", "long-1")
    assert r.returncode == 0, r.stderr + coordinator_log(c)
    procs = json.loads(r.stdout)["processes"]
    n1, n2 = c.nodes
    assert {p["rank"]: p["node"] for p in procs} == {0: n1.addr, 1: n1.addr, 2: n2.addr, 3: n2.addr}, procs
    assert all(p["python_ok"] and any(t["python"] for t in p["threads"]) for p in procs), procs

    # Another user's view: a job is only for its submitter (or root), and a wrong token gets nothing.
    r = ddpctl(c, "status", "--coordinator", f"{c.co.addr}:{COORD_PORT}", "--token-file", c.write_token("wrong"), "long-1")
    assert r.returncode != 0 and "long-1" not in r.stdout

    r = ddpctl(c, "stop", *via_coordinator(c), "long-1", timeout=60)
    assert r.returncode == 0, r.stderr
    assert "has ended" in r.stderr
    assert wait_gone(pids) == []
    rc, _, err = status(c, "long-1", *via_coordinator(c))
    assert rc == 1 and "job long-1 ended" in err and "(stopped, exit code 143)" in err, err


def test_detach_with_a_standing_coordinator(cluster):
    c = cluster
    start_coordinator(c)
    rc, out, err = finish(submit(c, job(c, "bg", "tick"), "--detach", "--job-id", "bg-1"), timeout=30)
    assert rc == 0, err
    assert out.strip() == "bg-1"
    # it returned once the ranks ran: their pids are known at once
    rc, st, err = status(c, "bg-1", *via_coordinator(c))
    assert rc == 0, err
    assert len(st["ranks"]) == 4 and all(r.get("pid") for r in st["ranks"]), st

    f = c.ctl.popen([os.path.join(c.bin, "ddpctl"), "logs", "-f", *via_coordinator(c), "bg-1"], stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, text=True, cwd=c.dir)
    seen = read_until(f, r"^\[3\] tick 3 rank 3$")
    assert any(l.startswith("[0] hello from rank 0 of 4") for l in seen), "".join(seen)
    r = ddpctl(c, "stop", *via_coordinator(c), "bg-1")
    assert r.returncode == 0, r.stderr
    rc, out, err = finish(f, timeout=30)
    assert rc == 0 and "job bg-1 ended (stopped)" in err, err


def test_detach_without_a_coordinator_runs_in_a_background_ddpctl(cluster):
    c = cluster
    p = c.ctl.popen([*runtime_env(c), os.path.join(c.bin, "ddpctl"), "launch", "--nodes", c.nodes_arg(c.nodes),
                     "--token-file", c.token, "--detach", "--job-id", "solo-1", job(c, "solo", "tick")],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=c.dir)
    rc, out, err = finish(p, timeout=30)
    assert rc == 0, err
    assert out.strip() == "solo-1"
    rc, st, err = status(c, "solo-1")
    assert rc == 0, err
    background = st["pid"]
    assert background != p.pid and alive(background)
    assert len(st["ranks"]) == 4 and all(r.get("pid") for r in st["ranks"]), st  # it returned once they ran

    r = None
    deadline = time.time() + 60
    while time.time() < deadline:  # the ranks start a moment after the launch returned
        r = ddpctl(c, "logs", "--ranks", "2", "solo-1")
        if "tick 1 rank 2" in r.stdout:
            break
        time.sleep(0.5)
    assert "[2] hello from rank 2 of 4" in r.stdout, r.stdout + r.stderr

    r = ddpctl(c, "stop", "solo-1")
    assert r.returncode == 0, r.stderr
    assert wait_gone([background]) == []
    log_dir = os.path.join(c.dir, "logs", "solo-1")
    result = json.load(open(os.path.join(log_dir, "result.json")))
    assert result["status"] == "stopped"
    assert "job solo-1 stopped" in open(os.path.join(log_dir, "coordinator.log")).read()
    # the background ddpctl is gone; status still says how the job ended and where its result is
    rc, _, err = status(c, "solo-1")
    assert rc == 1 and "job solo-1 ended" in err and f"result: {log_dir}/result.json" in err, err
    r = ddpctl(c, "logs", "--ranks", "2", "solo-1")
    assert r.returncode == 0 and "[2] hello from rank 2 of 4" in r.stdout, r.stdout + r.stderr


def test_a_detached_submit_that_cannot_start_fails_with_its_reason(cluster):
    # With a standing coordinator too: --detach returns once every rank runs, or fails as a
    # foreground submit would.
    c = cluster
    start_coordinator(c)
    spec = c.write("missing.yaml", "name: missing\nnproc_per_node: 2\ncommand: [/no/such/program]\nstore: {port: 29500}\n")
    rc, out, err = finish(submit(c, spec, "--detach", "--job-id", "gone-2"), timeout=60)
    assert rc == 2, err
    assert out.strip() == "", out
    assert "preflight failed" in err and "/no/such/program" in err, err


def test_a_detached_launch_that_cannot_start_fails_with_its_reason(cluster):
    # --detach returns once every rank runs; a job that never gets there fails here, as a
    # foreground launch would, and leaves no background ddpctl behind.
    c = cluster
    spec = c.write("missing.yaml", "name: missing\nnproc_per_node: 2\ncommand: [/no/such/program]\nstore: {port: 29500}\n")
    rc, out, err = detach(c, "gone-1", spec)
    assert rc == 2, err
    assert out.strip() == "", out
    assert "preflight failed" in err and "/no/such/program" in err, err
    result = json.load(open(os.path.join(c.dir, "logs", "gone-1", "result.json")))
    assert result["status"] == "failed" and "/no/such/program" in result["message"], result
    rc, _, err = status(c, "gone-1")
    # The record says why, as the result file does.
    assert rc == 1 and "job gone-1 ended" in err and "(failed, exit code 2: " in err and "/no/such/program" in err, err


def detach(c, job_id, spec):
    return finish(c.ctl.popen([*runtime_env(c), os.path.join(c.bin, "ddpctl"), "launch", "--nodes",
                               c.nodes_arg(c.nodes), "--token-file", c.token, "--detach", "--job-id", job_id, spec],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=c.dir), timeout=60)


def victim_file(c):
    victim = os.path.join(c.dir, "victim.txt")
    with open(victim, "w") as f:
        f.write("untouched\n")
    return victim


def test_a_detached_launch_refuses_a_job_folder_someone_else_made(cluster):
    """--detach keeps the background ddpctl's log and result in <log_dir>/<job id>. Another user
    who made that folder first (a log_dir in a folder everyone can write) and put a link in it
    where the log goes must not get root's log appended to a file of their choice: the launch
    refuses the folder, says whose it is, and starts nothing. A link where the log goes in a
    folder of the launcher's own is refused too (never followed)."""
    c = cluster
    logs = os.path.join(c.dir, "logs")
    os.makedirs(logs, exist_ok=True)
    victim = victim_file(c)
    planted = os.path.join(logs, "planted-1")
    os.mkdir(planted)
    os.symlink(victim, os.path.join(planted, "coordinator.log"))
    os.chown(planted, 65534, 65534)
    rc, out, err = detach(c, "planted-1", job(c, "planted", "tick"))
    assert rc == 2, err
    assert "cannot keep the job's log in" in err and "belongs to uid 65534" in err, err
    assert out.strip() == "", out
    rc, _, err = status(c, "planted-1")
    assert rc != 0, err  # nothing ran

    own = os.path.join(logs, "linked-1")
    os.mkdir(own, 0o700)
    os.symlink(victim, os.path.join(own, "coordinator.log"))
    rc, out, err = detach(c, "linked-1", job(c, "linked", "tick"))
    assert rc == 2, err
    assert "cannot keep the job's log in" in err and "symbolic link" in err, err
    assert open(victim).read() == "untouched\n"


def test_a_detached_launch_writes_its_result_into_its_own_folder_when_moved(cluster):
    """The result and each attempt's folder go below the job folder's descriptor, opened at the
    launch: whoever owns log_dir may move the job's folder away while the job runs and put a
    folder of their own with a link named result.json in its place; the next attempt's folder
    (a rank fails after the move; one restart) and the result still land in the job's own folder,
    wherever it moved, and the linked file is untouched."""
    c = cluster
    logs = os.path.join(c.dir, "logs")
    os.makedirs(logs, exist_ok=True)
    os.chown(logs, 65534, 65534)  # a log_dir of another user's (e.g. /tmp/logs, made first)
    os.chmod(logs, 0o755)
    os.chmod(c.dir, 0o755)  # they can reach it
    victim = victim_file(c)
    flag = os.path.join(c.dir, "fail-now")
    spec = job(c, "swap", "fail-on-flag")
    with open(spec, "a") as f:
        f.write(f"restart: {{max_restarts: 1, backoff: 1s}}\nenv: {{FLAG: {flag}}}\n")
    rc, out, err = detach(c, "swap-1", spec)
    assert rc == 0, err
    r = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "sh", "-c",
                        f"cd {logs} && mv swap-1 swap-1.moved && mkdir swap-1 && ln -s {victim} swap-1/result.json"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    open(flag, "w").close()  # rank 3 fails: attempt 1 starts
    attempt1 = os.path.join(logs, "swap-1.moved", "attempt-1")
    wait_for(lambda: os.path.isdir(attempt1) and os.listdir(attempt1), timeout=60,
             what="attempt 1's logs in the job's moved folder")
    r = ddpctl(c, "stop", "swap-1")
    assert r.returncode == 0, r.stderr
    moved = os.path.join(logs, "swap-1.moved", "result.json")
    wait_for(lambda: os.path.exists(moved), timeout=30, what="result.json in the job's moved folder")
    assert json.load(open(moved))["status"] == "stopped"
    assert open(victim).read() == "untouched\n"
    assert sorted(os.listdir(os.path.join(logs, "swap-1"))) == ["result.json"]  # theirs: the link alone
    assert os.path.islink(os.path.join(logs, "swap-1", "result.json"))


REACH_STORE = r'''
import os, socket
port = int(os.environ["MASTER_PORT"])
socket.create_connection((os.environ["MASTER_ADDR"], port), timeout=10).close()
print(f"rank {os.environ['RANK']} reached the store at port {port}", flush=True)
'''


def test_a_taken_default_store_port_gives_way_through_a_standing_coordinator_too(cluster):
    """Another job holds 29500 on node rank 0's node. Submitted through a standing coordinator
    (protocol version 7), a job that names no port gets a free one there, as it does launched
    straight to the agents; every rank on both nodes reaches the store at that port."""
    c = cluster
    start_coordinator(c)
    n1 = c.nodes[0]
    n1.hold_port(29500)
    worker = c.write("reach.py", REACH_STORE)
    spec = c.write("free.yaml", f"name: free\nnproc_per_node: 2\ncommand: {json.dumps([PY, worker])}\n")
    rc, out, err = finish(submit(c, spec, "--job-id", "free-1"), timeout=120)
    assert rc == 0, out + err + coordinator_log(c)
    reached = re.findall(r"rank (\d) reached the store at port (\d+)", out)
    assert sorted(int(r) for r, _ in reached) == [0, 1, 2, 3], out
    ports = {p for _, p in reached}
    assert len(ports) == 1 and ports != {"29500"}, reached
    assert "store port 29500 is taken on this node; using a free port" in c.agent_log(n1)
