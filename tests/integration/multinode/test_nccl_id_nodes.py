"""The job's NCCL unique id and store.port 0 across simulated nodes (issues 4 and 5).

Node rank 0's agent makes each attempt's id with a ddp-ncclid holder (its workers' environment:
their NCCL_SOCKET_IFNAME, the libnccl their loader finds), and picks the store's port when the
job says 0; both reach every node before any rank starts. Workers check what a user would: the
same DDP_NCCL_UNIQUE_ID everywhere, its bootstrap root listening on node rank 0's address, the
store listening at MASTER_ADDR:MASTER_PORT; a new id after a restart; nothing listening after
the job. A node without libnccl (its library folder hidden in its mount namespace) fails
`unique_id: on` with a clear error and runs `auto` without an id.
"""
import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import simcluster  # noqa: E402
from simcluster import finish  # noqa: E402

SKIP = simcluster.netns_unavailable()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

PY = "/usr/bin/python3"

WORKER = r'''
import json, os, socket, subprocess, sys, time
ncclid, out = sys.argv[1], sys.argv[2]
r, n, world = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"], int(os.environ["WORLD_SIZE"])
hexid = os.environ.get("DDP_NCCL_UNIQUE_ID")
master = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
rec = {"id": hexid, "master": list(master), "host": socket.gethostname(), "ifname": os.environ.get("NCCL_SOCKET_IFNAME")}
socket.create_connection(master, timeout=10).close()  # the job's store listens there
if hexid:
    rec["addr"] = json.loads(subprocess.run([ncclid, "--decode", hexid], capture_output=True, text=True).stdout)
    socket.create_connection((rec["addr"]["ip"], rec["addr"]["port"]), timeout=10).close()  # NCCL's bootstrap root
json.dump(rec, open(os.path.join(out, f"id-{r}-{n}.json"), "w"))
if sys.argv[3:] == ["fail-once"] and n == "0" and r == str(world - 1):
    # fail the first attempt once every rank has checked in, to see the next attempt's id
    deadline = time.time() + 60
    while time.time() < deadline and len([f for f in os.listdir(out) if f.endswith("-0.json")]) < world:
        time.sleep(0.1)
    sys.exit(1)
'''


def write_job(c, name, extra, *args):
    worker = c.write("ncclworker.py", WORKER)
    out = os.path.join(c.dir, f"out-{name}")
    os.makedirs(out)
    cmd = [PY, worker, os.path.join(c.bin, "ddp-ncclid"), out, *args]
    job = c.write(f"{name}.yaml", f"name: {name}\nnproc_per_node: 1\ncommand: {json.dumps(cmd)}\nstop: {{grace: 3s}}\n{extra}")
    return job, out


def records(out):
    recs = {}
    for f in os.listdir(out):
        _, rank, attempt = f[:-len(".json")].split("-")
        recs[(int(rank), int(attempt))] = json.load(open(os.path.join(out, f)))
    return recs


def nccl_loadable():
    r = subprocess.run([os.path.join(simcluster.BIN, "ddp-ncclid")], input="", capture_output=True, text=True,
                       timeout=30, env={"NCCL_SOCKET_IFNAME": "lo", "PATH": "/usr/bin:/bin"})
    return r.returncode == 0 and not r.stdout.startswith("error:")


def nccl_folder():
    """The folder the loader finds libnccl.so.2 in (to hide it on one simulated node)."""
    for line in subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout.splitlines():
        if line.strip().startswith("libnccl.so.2 ") and "=>" in line:
            return os.path.dirname(os.path.realpath(line.split("=>")[1].strip()))
    return None


needs_nccl = pytest.mark.skipif(not nccl_loadable(),
                                reason="libnccl.so.2 is not loadable here")


@needs_nccl
def test_every_rank_on_every_node_gets_node_rank_0s_id_and_a_new_one_per_attempt():
    with simcluster.Cluster(nodes=3) as c:
        for h in c.hosts:
            c.start_agent(h)
        job, out = write_job(c, "ncclid", "nccl: {unique_id: on}\nstore: {port: 0}\nrestart: {max_restarts: 1, backoff: 200ms}\n",
                             "fail-once")
        rc, out_, err = finish(c.launch(job, "--result-json", os.path.join(c.dir, "r.json")), timeout=120)
        assert rc == 0, err
        recs = records(out)
        assert sorted(recs) == [(r, a) for r in range(3) for a in range(2)], f"{sorted(recs)}\n{out_}\n{err}"
        n1 = c.hosts[0]
        for a in range(2):
            ids = {recs[(r, a)]["id"] for r in range(3)}
            assert len(ids) == 1 and len(ids.pop()) == 256, recs
            assert {recs[(r, a)]["host"] for r in range(3)} == {"n1", "n2", "n3"}
        assert recs[(0, 0)]["id"] != recs[(0, 1)]["id"], "the restart must bring a new id"
        ports = {tuple(v["master"]) for v in recs.values()}
        assert len(ports) == 1, ports  # one store for the job, the same port in every attempt
        master_addr, master_port = ports.pop()
        assert master_addr == n1.addr and master_port not in (0, 29500), master_port
        for v in recs.values():  # made on node rank 0, on the workers' interface there
            assert v["addr"]["ip"] == n1.addr and v["ifname"] == "eth0", v
        assert json.load(open(os.path.join(c.dir, "r.json")))["restarts"] == 1
        # After the job nobody listens there any more (checked from n2: the network rule).
        endpoints = [(v["addr"]["ip"], v["addr"]["port"]) for v in recs.values()] + [(master_addr, master_port)]
        probe = ("import socket, sys\nok = 0\nfor ip, port in %r:\n    try:\n        socket.create_connection((ip, port),"
                 " timeout=3).close(); ok += 1\n    except OSError:\n        pass\nsys.exit(ok)\n" % endpoints)
        r = c.hosts[1].run([PY, "-c", probe])
        assert r.returncode == 0, f"{r.returncode} endpoints still accept connections after the job: {r.stderr}"


@needs_nccl
def test_node_rank_0_without_libnccl():
    folder = nccl_folder()
    if folder is None:
        pytest.skip("ldconfig does not list libnccl.so.2")
    with simcluster.Cluster(nodes=2) as c:
        n1, n2 = c.hosts
        c.start_agent(n1, hide=[folder])
        c.start_agent(n2)
        job, out = write_job(c, "on", "nccl: {unique_id: on}\n")
        rc, _, err = finish(c.launch(job), timeout=120)
        assert rc == 2, err
        assert f"nccl.unique_id: on, but node rank 0 (n1) cannot make the id" in err, err
        assert "install NCCL or set nccl.unique_id: off" in err, err
        assert os.listdir(out) == [], "no rank may start without the id"
        # auto: the job runs, without an id (every rank alike)
        job, out = write_job(c, "auto", "nccl: {unique_id: auto}\nstore: {port: 0}\n")
        rc, _, err = finish(c.launch(job), timeout=120)
        assert rc == 0, err
        recs = records(out)
        assert sorted(recs) == [(0, 0), (1, 0)] and all(v["id"] is None for v in recs.values()), recs
