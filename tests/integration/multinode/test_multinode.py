"""Multi-node launches across simulated hosts (issue 5): ddp-agentd on n1 and n2, ddpctl on a
host of its own, everything over the authenticated protocol (simcluster.py has the rules).

Each test bounds its waits; the cluster fixture tears down every process and namespace it made.
"""
import json
import os
import shutil
import re
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import simcluster  # noqa: E402
from ddptest import alive, torch_examples_built  # noqa: E402
from simcluster import LINE, contracts, finish, wait_for_contracts  # noqa: E402

SKIP = simcluster.netns_unavailable()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

PY = "/usr/bin/python3"

CONTRACT_WORKER = r'''
import json, os, socket, sys, time
keys = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR",
        "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
        "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "DDP_NODE"]
env = {k: os.environ.get(k) for k in keys}
env["hostname"] = socket.gethostname()
env["pid"] = os.getpid()
print("CONTRACT " + json.dumps(env), flush=True)
mode = sys.argv[1] if len(sys.argv) > 1 else ""
if mode == "fail-rank-3":
    if env["RANK"] == "3":
        time.sleep(1.0)
        print("rank 3 gives up", file=sys.stderr, flush=True)
        sys.exit(7)
    time.sleep(120)
elif mode == "sleep":
    time.sleep(120)
elif mode == "wait-store":
    if env["RANK"] in ("1", "3"):  # one on the store's node, one on the other
        import datetime
        import torch.distributed as d
        s = d.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), None, False, timeout=datetime.timedelta(seconds=300))
        print("waiting on the store", flush=True)
        s.wait(["nobody_sets_this"])
    time.sleep(120)
elif mode == "family" or (mode == "family-then-exit" and env["WORLD_SIZE"] == "3"):
    # What a kill of the agent must still reach: a grandchild in a session of its own that
    # ignores SIGTERM, and a double-forked daemon (re-parented away from the worker).
    import signal, subprocess
    g = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                          "time.sleep(300)"], start_new_session=True)
    r, w = os.pipe()
    mid = os.fork()
    if mid == 0:
        os.setsid()
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            os.write(w, str(os.getpid()).encode())
            os.close(w)
            time.sleep(300)
        os._exit(0)
    os.close(w)
    os.waitpid(mid, 0)
    daemon = int(os.read(r, 32))
    print("FAMILY " + json.dumps({"worker": os.getpid(), "grandchild": g.pid, "daemon": daemon}), flush=True)
    time.sleep(120)
elif mode == "reach-store":
    # MASTER_ADDR:MASTER_PORT answers (a TCP connect: the store listens there); rank 3 fails the
    # first attempt when asked to, so a restart shows the port the next attempt gets.
    socket.create_connection((env["MASTER_ADDR"], int(env["MASTER_PORT"])), timeout=20).close()
    print("STORE_REACHED", flush=True)
    if sys.argv[2:] == ["fail-first"] and env["RANK"] == "3" and env["TORCHELASTIC_RESTART_COUNT"] == "0":
        sys.exit(7)
elif mode == "family-then-exit":
    pass  # a re-formed (smaller) round: done
elif mode == "fail-first-attempt":
    if env["RANK"] == "3" and env["TORCHELASTIC_RESTART_COUNT"] == "0":
        time.sleep(0.5)
        sys.exit(7)
'''


@pytest.fixture
def cluster():
    with simcluster.Cluster(nodes=2) as c:
        yield c


def job(c, name, command, extra="", **kw):
    return simcluster.job_file(c, name, command, nproc=2, extra=extra, **kw)


def wait_gone(pids, timeout=15):
    deadline = time.time() + timeout
    while time.time() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def test_contract_across_two_nodes(cluster):
    c = cluster
    for h in c.hosts:
        c.start_agent(h)
    worker = c.write("contract.py", CONTRACT_WORKER)
    rc, out, err = finish(c.launch(job(c, "contract", [PY, worker]), "--result-json", os.path.join(c.dir, "r.json")))
    assert rc == 0, err
    by_rank = contracts(out)
    assert sorted(by_rank) == [0, 1, 2, 3], out + err
    n1, n2 = c.hosts
    for rank, (node, env) in by_rank.items():
        host = n1 if rank < 2 else n2
        assert node == host.addr
        assert env["hostname"] == host.name
        assert env["RANK"] == str(rank)
        assert env["LOCAL_RANK"] == str(rank % 2)
        assert env["WORLD_SIZE"] == "4" and env["LOCAL_WORLD_SIZE"] == "2"
        assert env["GROUP_RANK"] == ("0" if rank < 2 else "1") and env["GROUP_WORLD_SIZE"] == "2"
        assert env["MASTER_ADDR"] == n1.addr and env["MASTER_PORT"] == "29500"
        assert env["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        assert env["GLOO_SOCKET_IFNAME"] == "eth0" and env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert len({env["TORCHELASTIC_RUN_ID"] for _, env in by_rank.values()}) == 1
    result = json.load(open(os.path.join(c.dir, "r.json")))
    assert result["status"] == "succeeded" and result["exit_code"] == 0
    assert sorted(e["rank"] for e in result["attempts"][0]["exits"]) == [0, 1, 2, 3]


def test_a_taken_default_store_port_on_node_rank_0_gives_way_to_a_free_one(cluster):
    """Another job's store (here: any listener) holds 29500 on node rank 0. Left out of the job
    file, the store takes a free port there and every rank on both nodes gets it; named, the job
    fails and says which port."""
    c = cluster
    for h in c.hosts:
        c.start_agent(h)
    n1 = c.hosts[0]
    n1.hold_port(29500)
    worker = c.write("contract.py", CONTRACT_WORKER)
    free = job(c, "free-port", [PY, worker, "reach-store", "fail-first"], store="{threads: 1}",
               extra="restart: {max_restarts: 1, backoff: 200ms}\n")
    r = c.ctl.run([os.path.join(c.bin, "ddpctl"), "launch", "--dry-run", "--token-file", c.token, "--nodes",
                   c.nodes_arg(), free], timeout=60)
    assert r.returncode == 0, r.stderr
    assert any(n.startswith("MASTER_PORT is 29500 unless that port is taken") for n in json.loads(r.stdout)["notes"])
    rc, out, err = finish(c.launch(free), timeout=120)
    assert rc == 0, out + err
    # Rank 3 (on n2) reached the store and failed the first attempt (the others may not have
    # started their script before the stop); in the second every rank, on both nodes, reached it.
    # One port for all, not 29500: the restart kept it.
    seen = [(env["TORCHELASTIC_RESTART_COUNT"], rank, env) for line in out.splitlines()
            for rank, (_, env) in contracts(line).items()]
    assert ("0", 3) in [(a, r) for a, r, _ in seen], out + err
    assert sorted(r for a, r, _ in seen if a == "1") == [0, 1, 2, 3], out + err
    ports = {env["MASTER_PORT"] for _, _, env in seen}
    assert len(ports) == 1 and ports != {"29500"}, seen
    assert all(env["MASTER_ADDR"] == n1.addr for _, _, env in seen)
    reached = [int(LINE.match(l)["rank"]) for l in out.splitlines() if l.endswith("] STORE_REACHED")]
    assert reached.count(3) == 2 and sorted(set(reached)) == [0, 1, 2, 3], out
    assert "store port 29500 is taken on this node; using a free port" in c.agent_log(n1)

    rc, out, err = finish(c.launch(job(c, "named-port", [PY, worker])))  # store: {port: 29500}
    assert rc != 0, out + err
    assert re.search(r"cannot serve the job's store: .*29500", out + err), out + err
    assert not contracts(out), "no rank may start without its store"


def test_gloo_ddp_across_two_nodes_through_the_agent_store(cluster):
    c = cluster
    for h in c.hosts:
        c.start_agent(h)
    # the script must be where every host sees it: the checkout may sit under /tmp, which each
    # simulated host replaces with its own
    train = os.path.join(c.dir, "train_ddp.py")
    shutil.copy2(os.path.join(simcluster.SRC, "examples", "python", "train_ddp.py"), train)
    params = os.path.join(c.dir, "params-{rank}.json")
    cmd = [PY, train, "--epochs", "2", "--dump-params", params, "--checkpoint", os.path.join(c.dir, "ckpt", "{run_id}.pt")]
    rc, out, err = finish(c.launch(job(c, "ddp", cmd)), timeout=180)
    assert rc == 0, out + err
    dumps = [json.load(open(params.format(rank=r))) for r in range(4)]
    assert all(d["world_size"] == 4 for d in dumps)
    assert all(d["params"] == dumps[0]["params"] for d in dumps), "ranks ended with different parameters"
    assert re.search(r"^\[10\.213\.\d+\.11:0\] epoch 1 loss", out, re.M), out
    # node rank 0's agent served the store on threads of its own (store.threads: auto, the default)
    assert re.search(r"store on \S+ \(\d+ I/O threads?\)", c.agent_log(c.hosts[0])), c.agent_log(c.hosts[0])


def test_rank_failure_on_node2_stops_node1_and_is_named(cluster):
    c = cluster
    for h in c.hosts:
        c.start_agent(h)
    worker = c.write("contract.py", CONTRACT_WORKER)
    p = c.launch(job(c, "fail", [PY, worker, "fail-rank-3"]), "--result-json", os.path.join(c.dir, "r.json"))
    started = time.time()
    rc, out, err = finish(p, timeout=60)
    assert rc == 1, err
    assert time.time() - started < 30, "failure propagation took too long"
    n2 = c.hosts[1]
    assert f"first failure: rank 3 (local rank 1, node {n2.addr}" in err, err
    assert "exited with code 7" in err and "rank 3 gives up" in err, err
    pids = [env["pid"] for _, env in contracts(out).values()]
    assert len(pids) == 4
    assert wait_gone(pids) == [], "workers left running after the job failed"
    result = json.load(open(os.path.join(c.dir, "r.json")))
    ff = result["attempts"][0]["first_failure"]
    assert ff["rank"] == 3 and ff["node"] == n2.addr and ff["exit_code"] == 7


def test_ranks_that_outlive_the_stop_grace_are_named_by_the_launcher(cluster):
    # Rank 3 fails; the others ignore SIGTERM: the grace period (3 s) ends in SIGKILL on the
    # nodes, and the launcher's report says so (the agents' own lines stay on the nodes).
    c = cluster
    for h in c.hosts:
        c.start_agent(h)
    worker = c.write("stubborn.py", """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("up", flush=True)
if os.environ["RANK"] == "3":
    time.sleep(1)
    sys.exit(5)
time.sleep(120)
""")
    p = c.launch(job(c, "stubborn", [PY, worker]))
    rc, out, err = finish(p, timeout=60)
    assert rc == 1, err
    assert "first failure: rank 3" in err, err
    assert "3 ranks were still running after the 3s stop grace: SIGKILL" in err, err


def wait_for_families(p, n, timeout=60):
    """{rank: (node, pids)} once n ranks printed their FAMILY line."""
    return simcluster.wait_for_tagged(p, n, "FAMILY ", timeout)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
def test_agent_killed_or_stopped_mid_run_fails_the_job_and_leaves_nothing(cluster, sig):
    # kill -9 of n2's agent: its shepherd still takes the job's whole tree down. SIGTERM
    # (systemctl stop): the agent stops its workers and says why first (`leaving`), so the report
    # names the node's leaving, not its ranks' SIGTERM exits, and the agent then exits.
    c = cluster
    for h in c.hosts:
        c.start_agent(h)
    worker = c.write("contract.py", CONTRACT_WORKER)
    p = c.launch(job(c, "kill", [PY, worker, "family"]))
    families = wait_for_families(p, 4)
    n2 = c.hosts[1]
    on_n2 = [pid for node, f in families.values() if node == n2.addr for pid in f.values()]
    assert len(on_n2) == 6 and all(alive(pid) for pid in on_n2), families
    os.kill(c.agents["n2"].pid, sig)
    rc, out, err = finish(p, timeout=60)
    assert rc == 1, err
    reason = ": its agent is shutting down (SIGTERM)" if sig == signal.SIGTERM else ""
    assert f"first failure: node {n2.addr} was lost{reason}" in err, err
    # no rank is the cause: the stop ended the other node's ranks ("then:"), n2's went with it
    assert "first failure: rank" not in err, err
    if sig == signal.SIGTERM:
        try:
            assert c.agents["n2"].wait(timeout=30) == 0, "the agent ends once its workers are stopped"
        except subprocess.TimeoutExpired:
            raise AssertionError("n2's agent still runs 30 s after SIGTERM:\n" + c.agent_log(n2))
    # Nothing at all is left on n2 (its network namespace is empty): the whole tree the job's
    # shepherd is subreaper of is gone.
    assert wait_gone(on_n2) == [], "processes left running on n2"
    deadline = time.time() + 15
    while n2.ns_pids() and time.time() < deadline:
        time.sleep(0.1)
    left = n2.ns_pids()
    assert left == [], "still running on n2: " + "; ".join(
        open(f"/proc/{pid}/cmdline").read().replace("\0", " ") for pid in left if alive(pid))
    # Node 1's workers (and their descendants) are stopped by its agent.
    assert wait_gone([pid for _, f in families.values() for pid in f.values()]) == []
    assert c.agents["n1"].poll() is None, "the surviving agent must keep serving"


def test_wrong_token_is_refused_and_the_agent_serves_the_next_client(cluster):
    c = cluster
    for h in c.hosts:
        c.start_agent(h)
    worker = c.write("contract.py", CONTRACT_WORKER)
    bad = c.write_token("bad-token")
    result = os.path.join(c.dir, "badtoken.json")
    rc, out, err = finish(c.launch(job(c, "badtoken", [PY, worker]), "--result-json", result, token=bad), timeout=30)
    assert rc == 2, err
    assert "authentication failed" in err and "failed to prove" in err and "token file" in err, err
    # one line says it, not a warning and then the error
    assert err.count("failed to prove") == 1, err
    # the result file says why too (a detached launch's user reads that, not the terminal)
    r = json.load(open(result))
    assert r["status"] == "failed" and r["attempts"] == [] and "authentication failed" in r["message"], r
    assert "CONTRACT" not in out
    for h in c.hosts:
        assert c.agents[h.name].poll() is None
    # ddpctl checks each agent's proof first and tells the one it caught why it leaves (the agent
    # logs it); ddpctl then gives up, so another agent may only see a connection closed mid-handshake.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any("auth" in c.agent_log(h) for h in c.hosts):
        time.sleep(0.05)
    assert any("auth" in c.agent_log(h) for h in c.hosts), [c.agent_log(h) for h in c.hosts]
    rc, out, err = finish(c.launch(job(c, "goodtoken", [PY, worker])), timeout=60)
    assert rc == 0, err
    assert sorted(contracts(out)) == [0, 1, 2, 3]


def test_sigint_to_ddpctl_stops_every_node(cluster):
    c = cluster
    for h in c.hosts:
        c.start_agent(h)
    worker = c.write("contract.py", CONTRACT_WORKER)
    p = c.launch(job(c, "sigint", [PY, worker, "sleep"]), "--result-json", os.path.join(c.dir, "r.json"))
    seen = wait_for_contracts(p, 4)
    os.kill(p.pid, signal.SIGINT)
    rc, out, err = finish(p, timeout=30)
    assert rc == 128 + signal.SIGINT, err
    pids = [env["pid"] for _, env in seen.values()]
    assert wait_gone(pids, timeout=5) == [], "workers left running after Ctrl-C"
    result = json.load(open(os.path.join(c.dir, "r.json")))
    assert result["status"] == "stopped"
    # the ranks the stop ended did not fail: no "first failure" for a Ctrl-C
    assert "first failure" not in err and result["attempts"][0]["first_failure"] is None, err
    for h in c.hosts:
        assert c.agents[h.name].poll() is None


def test_timeout_names_the_missing_node(cluster):
    c = cluster
    c.start_agent(c.hosts[0])  # n2 has no agent
    worker = c.write("contract.py", CONTRACT_WORKER)
    rc, out, err = finish(c.launch(job(c, "missing", [PY, worker], "rendezvous: {join_timeout: 3s}\n")), timeout=30)
    assert rc == 1, err
    assert f"1/2 nodes joined; missing: {c.hosts[1].addr}" in err, err


def test_failure_with_a_restart_left_restarts_every_node(cluster):
    c = cluster
    for h in c.hosts:
        c.start_agent(h)
    worker = c.write("contract.py", CONTRACT_WORKER)
    p = c.launch(job(c, "restart", [PY, worker, "fail-first-attempt"], "restart: {max_restarts: 1, backoff: 200ms}\n"),
                 "--result-json", os.path.join(c.dir, "r.json"))
    rc, out, err = finish(p, timeout=60)
    assert rc == 0, err
    result = json.load(open(os.path.join(c.dir, "r.json")))
    assert result["restarts"] == 1 and result["status"] == "succeeded"
    assert result["attempts"][0]["first_failure"]["rank"] == 3
    restarts = {env["TORCHELASTIC_RESTART_COUNT"] for line in out.splitlines() for _, env in contracts(line).values()}
    assert restarts == {"0", "1"}, out


@pytest.mark.parametrize("how", ["sigkill", "link-down"])
def test_launcher_gone_leaves_nothing_running(cluster, how):
    c = cluster
    for h in c.hosts:
        c.start_agent(h)
    worker = c.write("contract.py", CONTRACT_WORKER)
    p = c.launch(job(c, "gone", [PY, worker, "sleep"]))
    seen = wait_for_contracts(p, 4)
    if how == "sigkill":
        os.kill(p.pid, signal.SIGKILL)  # the agents see the connection close
    else:
        subprocess.run(["ip", "link", "set", c.ctl.veth, "down"], check=True)  # only heartbeats tell
    pids = [env["pid"] for _, env in seen.values()]
    # heartbeat timeout (3 s) + stop grace (3 s) + slack
    assert wait_gone(pids, timeout=12) == [], f"workers left running after the launcher went away ({how})"
    for h in c.hosts:
        assert c.agents[h.name].poll() is None


def test_status_logs_and_stop_reach_a_multinode_job(cluster, monkeypatch):
    c = cluster
    # The launcher's control socket in a folder the test reaches (each host's /tmp is its own).
    rt = os.path.join(c.dir, "rt")
    os.mkdir(rt, 0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", rt)
    for h in c.hosts:
        c.start_agent(h)
    worker = c.write("contract.py", CONTRACT_WORKER)
    p = c.launch(job(c, "ctl", [PY, worker, "wait-store"]), "--job-id", "mn-ctl")
    seen = wait_for_contracts(p, 4)
    bin_ = os.path.join(c.bin, "ddpctl")
    # Node rank 0's agent reports the store's waiters with its heartbeat: poll until both show.
    deadline = time.time() + 90
    while True:
        r = c.ctl.run([bin_, "status", "--json"])
        assert r.returncode == 0, r.stderr
        s = json.loads(r.stdout)
        waiting = [w for w in s["store_waiters"] if "nobody_sets_this" in w]
        if (waiting and waiting[0].startswith("2/4")) or time.time() > deadline:
            break
        time.sleep(0.5)
    assert waiting and waiting[0].startswith("2/4"), s["store_waiters"]
    assert "rank 1" in waiting[0] or "ranks 1" in waiting[0], waiting  # the local one is named
    assert s["job_id"] == "mn-ctl" and s["mode"] == "nodes" and s["pid"] == p.pid
    assert s["store"] == f"{c.hosts[0].addr}:29500"
    assert sorted(s["nodes"]) == sorted(h.addr for h in c.hosts)
    assert [(x["rank"], x["node"]) for x in s["ranks"]] == [(rank, seen[rank][0]) for rank in range(4)]
    assert [x["pid"] for x in s["ranks"]] == [seen[rank][1]["pid"] for rank in range(4)]
    assert all(x["state"] == "running" and x["last_output_age_s"] is not None for x in s["ranks"]), s["ranks"]
    text = c.ctl.run([bin_, "status"])
    assert text.returncode == 0 and "store waiters:" in text.stdout and "nobody_sets_this" in text.stdout, text.stdout
    assert all(str(seen[rank][1]["pid"]) in text.stdout for rank in range(4)), text.stdout
    r = c.ctl.run([bin_, "logs", "--ranks", "3"])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines and all(l.startswith("[3] ") for l in lines) and any("CONTRACT " in l for l in lines), lines
    r = c.ctl.run([bin_, "stop"], timeout=60)
    assert r.returncode == 0 and "job mn-ctl has ended" in r.stderr, r.stderr
    rc, out, err = finish(p, timeout=60)
    assert rc == 143, err
    # the report says what the job hung on, as a local launch's does
    assert any(l.strip().startswith("store: 2/4 ranks waiting on") and "nobody_sets_this" in l for l in err.splitlines()), err
    assert wait_gone([env["pid"] for _, env in seen.values()]) == []
    assert not os.path.exists(os.path.join(rt, "ddpctl", "mn-ctl.sock"))


def test_min_max_shrinks_without_a_restart_when_an_agent_is_killed():
    """nnodes 2:3 and no restarts allowed: kill -9 of n3's agent re-forms the job on n1 and n2
    (a membership change spends no restart), and nothing of the first round is left anywhere."""
    with simcluster.Cluster(nodes=3) as c:
        for h in c.hosts:
            c.start_agent(h)
        worker = c.write("contract.py", CONTRACT_WORKER)
        j = c.write("shrink.yaml", f"name: shrink\nnnodes: '2:3'\nnproc_per_node: 1\n"
                                   f"command: {json.dumps([PY, worker, 'family-then-exit'])}\nstop: {{grace: 3s}}\n"
                                   "rendezvous: {last_call: 1s}\nrestart: {max_restarts: 0}\n")
        p = c.launch(j, "--result-json", os.path.join(c.dir, "r.json"))
        families = wait_for_families(p, 3)
        n1, n2, n3 = c.hosts
        assert sorted(node for node, _ in families.values()) == sorted(h.addr for h in c.hosts)
        os.kill(c.agents["n3"].pid, signal.SIGKILL)
        rc, out, err = finish(p, timeout=90)
        assert rc == 0, err
        assert "no restart spent" in err, err
        result = json.load(open(os.path.join(c.dir, "r.json")))
        assert result["status"] == "succeeded" and result["restarts"] == 0, result
        last = result["attempts"][-1]
        assert sorted(e["rank"] for e in last["exits"]) == [0, 1] and all(e["exit_code"] == 0 for e in last["exits"])
        second = [env for line in out.splitlines() for _, env in contracts(line).values() if env["WORLD_SIZE"] == "2"]
        assert sorted(env["hostname"] for env in second) == ["n1", "n2"], out
        assert all(env["TORCHELASTIC_RESTART_COUNT"] == "0" for env in second)
        # Nothing of the first round runs anywhere: its workers, setsid()'d grandchildren and
        # double-forked daemons on every node, and nothing at all on n3.
        assert wait_gone([pid for _, f in families.values() for pid in f.values()]) == []
        deadline = time.time() + 15
        while n3.ns_pids() and time.time() < deadline:
            time.sleep(0.1)
        assert n3.ns_pids() == []
        assert c.agents["n1"].poll() is None and c.agents["n2"].poll() is None


def test_libtorch_cpp_example_across_two_nodes(cluster):
    example = os.path.join(simcluster.BIN, "ddp_cpp_example")
    if not torch_examples_built():
        pytest.skip("the build was configured with DDP_WITH_TORCH=OFF")
    assert os.path.exists(example), f"{example} is not built: DDP_WITH_TORCH is on, the build should have made it"
    c = cluster
    for h in c.hosts:
        c.start_agent(h)
    shutil.copy2(example, c.bin)  # where every host sees it (the build may sit under /tmp)
    rc, out, err = finish(c.launch(job(c, "cpp", [os.path.join(c.bin, "ddp_cpp_example"), "15"])), timeout=180)
    assert rc == 0, out + err
    sums = {}
    for line in out.splitlines():
        m = LINE.match(line)
        if m and "parameter checksum" in m["text"]:
            rank, value = re.match(r"rank (\d+) parameter checksum (\S+)", m["text"]).groups()
            sums[int(rank)] = (m["node"], value)
    assert sorted(sums) == [0, 1, 2, 3], out
    assert {node for node, _ in sums.values()} == {h.addr for h in c.hosts}
    assert len({v for _, v in sums.values()}) == 1, sums  # the ranks agree across nodes
    losses = [float(x) for x in re.findall(r"loss (\S+)", out)]
    assert losses and losses[-1] < losses[0] / 10, losses
