"""Binding end to end: the plan `--dry-run` shows for a recorded DGX node, and CPUs applied for
real to local workers (checked from inside them with sched_getaffinity)."""
import json
import os
import re
import shutil
import subprocess

import pytest

from ddptest import DDPCTL, PYTHON, SOURCE_DIR, launch, write_job


# A --nodes dry run resolves node rank 0's name as the coordinator would (MASTER_ADDR); these
# names resolve nowhere, and looking them up must not leave this machine: a network namespace of
# the test's own, without a route, answers at once.
NO_NET = ["unshare", "--net"] if os.geteuid() == 0 else ["unshare", "--net", "--map-root-user"]


def dry_run(tmp_path, job, *args):
    r = subprocess.run([*(NO_NET if "--nodes" in args else []), DDPCTL, "launch", "--dry-run", str(job), *args],
                       cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_dry_run_on_dgx_facts_shows_per_rank_binding(tmp_path):
    job = write_job(tmp_path, "nproc_per_node: gpu\ncommand: [python3, train.py]\n")
    facts = SOURCE_DIR / "tests" / "fixtures" / "facts" / "dgx-a.json"
    plan = dry_run(tmp_path, job, "--facts", str(facts))
    ranks = plan["ranks"]
    assert len(ranks) == 8
    uuids = [g["uuid"] for g in sorted(json.loads(facts.read_text())["gpus"], key=lambda g: g["pci_bus_id"])]
    for r in ranks:
        b = r["binding"]
        assert r["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(uuids) == b["cuda_visible_devices"]
        assert r["env"]["NCCL_IB_HCA"].startswith("=mlx5_0:1,")
        assert b["gpu"] == r["local_rank"]
        assert b["numa_node"] == (0 if r["local_rank"] < 4 else 1)
    assert len({r["binding"]["nic"] for r in ranks}) == 8
    assert {r["binding"]["cpus"] for r in ranks} == {"0-55,112-167", "56-111,168-223"}

    job = write_job(tmp_path, "nproc_per_node: gpu\ncommand: [python3, train.py]\n"
                    "binding: {gpu: isolate, numa: exclusive}\nenv: {NCCL_IB_HCA: mlx5_0}\n")
    ranks = dry_run(tmp_path, job, "--facts", str(facts))["ranks"]
    assert [r["env"]["CUDA_VISIBLE_DEVICES"] for r in ranks] == uuids
    assert len({r["binding"]["cpus"] for r in ranks}) == 8  # distinct shares
    assert all(r["env"]["NCCL_IB_HCA"] == "mlx5_0" for r in ranks)  # the job's env wins

    job = write_job(tmp_path, "nproc_per_node: 2\ncommand: [python3, train.py]\n"
                    "binding: {gpu: none, numa: none, nic: none}\n")
    ranks = dry_run(tmp_path, job, "--facts", str(facts))["ranks"]
    assert all(r["binding"] == {} and "CUDA_VISIBLE_DEVICES" not in r["env"] for r in ranks)


def test_workers_run_on_their_planned_cpus(tmp_path):
    allowed = sorted(os.sched_getaffinity(0))
    script = tmp_path / "worker.py"
    script.write_text("import os\n"
                      "lr = os.environ['LOCAL_RANK']\n"
                      "cpus = sorted(os.sched_getaffinity(0))\n"
                      "open(f'cpus.{lr}', 'w').write(','.join(map(str, cpus)))\n"
                      "try:\n"
                      "    heap = [l.split()[1] for l in open('/proc/self/numa_maps') if ' heap ' in l]\n"
                      "except OSError:\n"
                      "    heap = []\n"
                      "open(f'policy.{lr}', 'w').write(heap[0] if heap else '')\n")
    job = write_job(tmp_path, f"nproc_per_node: 2\ncommand: [{PYTHON}, {script}]\nbinding: {{numa: exclusive}}\n")
    plan = dry_run(tmp_path, job)
    r = launch(job)
    assert r.returncode == 0, r.stderr
    got = {}
    for rank in plan["ranks"]:
        lr = rank["local_rank"]
        cpus = [int(c) for c in (tmp_path / f"cpus.{lr}").read_text().split(",")]
        planned = rank["binding"]["cpus"]
        assert planned is not None, rank["binding"]
        expect = set()
        for part in planned.split(","):
            lo, _, hi = part.partition("-")
            expect.update(range(int(lo), int(hi or lo) + 1))
        assert cpus == sorted(expect), (lr, cpus, planned)
        assert set(cpus) <= set(allowed)
        policy = (tmp_path / f"policy.{lr}").read_text()
        # /proc/self/numa_maps exists (CONFIG_NUMA): the memory policy prefers the rank's node on
        # a machine of several, and is the default (a hand-started process's) on a machine of one.
        nodes = len([n for n in os.listdir("/sys/devices/system/node") if re.fullmatch(r"node\d+", n)])
        assert rank["binding"]["mem_node"] == (rank["binding"]["numa_node"] if nodes > 1 else None), rank["binding"]
        if policy:
            mem = rank["binding"]["mem_node"]
            assert policy == (f"prefer:{mem}" if mem is not None else "default"), policy
        got[lr] = cpus
    if len(allowed) >= 2:
        assert not set(got[0]) & set(got[1])  # exclusive: one share each


def test_binding_follows_numa_nodes_of_a_fixture_tree(tmp_path):
    """This machine's two CPUs split into two NUMA nodes (a sysfs tree through DDP_SYSFS_ROOT):
    the two CPU-only ranks go round-robin, one node and so one CPU each."""
    if not {0, 1} <= os.sched_getaffinity(0):
        pytest.skip("needs CPUs 0 and 1")
    root = tmp_path / "root"
    shutil.copytree(SOURCE_DIR / "tests" / "fixtures" / "sysfs" / "cpu-only", root, symlinks=True)
    for node, cpu in ((0, "0"), (1, "1")):
        d = root / "sys" / "devices" / "system" / "node" / f"node{node}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "cpulist").write_text(cpu + "\n")
    script = tmp_path / "worker.py"
    script.write_text("import os\n"
                      "lr = os.environ['LOCAL_RANK']\n"
                      "line = [l for l in open('/proc/self/status') if l.startswith('Cpus_allowed_list')][0]\n"
                      "open(f'cpus.{lr}', 'w').write(line.split(':')[1].strip())\n")
    job = write_job(tmp_path, f"nproc_per_node: 2\ncommand: [{PYTHON}, {script}]\n")
    r = launch(job, env={"DDP_SYSFS_ROOT": str(root)})
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "cpus.0").read_text() == "0"
    assert (tmp_path / "cpus.1").read_text() == "1"


def test_dry_run_with_nodes_plans_every_node_from_its_facts(tmp_path):
    """--nodes with --dry-run --facts: the rank assignment the rendezvous makes (node ranks in
    --nodes order, rank bases from each node's own count), each node's binding, and NCCL_IB_HCA
    as the IB devices every node has."""
    fixtures = SOURCE_DIR / "tests" / "fixtures" / "facts"
    b = json.loads((fixtures / "dgx-b.json").read_text())
    b["nics"] = [n for n in b["nics"] if n["name"] != "mlx5_3"]  # one rail down on node b
    b_file = tmp_path / "b.json"
    b_file.write_text(json.dumps(b))
    job = write_job(tmp_path, "nproc_per_node: gpu\ncommand: [python3, train.py]\n")
    facts = f"{fixtures / 'dgx-a.json'},{b_file},{fixtures / 'cpu-a.json'}"
    r = subprocess.run([DDPCTL, "launch", "--dry-run", "--nodes", "a,b", "--facts", facts, str(job)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "--facts names 3 files for 2 nodes" in r.stderr, r.stderr

    plan = dry_run(tmp_path, job, "--nodes", "a,b", "--facts", f"{fixtures / 'dgx-a.json'},{b_file}")
    # 'a' names no host here: its address is the coordinator's to find when it dials, and the plan
    # says so rather than give the name as an address
    assert plan["world_size"] == 16 and plan["nnodes"] == 2
    assert plan["master_addr"].startswith("<known at run time: a does not resolve here"), plan["master_addr"]
    hca = "=" + ",".join(f"mlx5_{i}:1" for i in range(8) if i != 3)
    assert plan["nccl_ib_hca"] == hca
    ranks = []
    for node_rank, node in enumerate(plan["nodes"]):
        assert node["node"] == "ab"[node_rank] and node["node_rank"] == node_rank
        assert node["rank_base"] == 8 * node_rank
        for rank in (r for r in plan["ranks"] if r["node"] == node["node"]):
            env = rank["env"]
            assert env["GROUP_RANK"] == str(node_rank) and env["WORLD_SIZE"] == "16"
            assert env["MASTER_ADDR"] == plan["master_addr"]
            assert env["NCCL_IB_HCA"] == hca
            assert rank["binding"]["gpu"] == rank["local_rank"]
            ranks.append(rank["rank"])
    assert ranks == list(range(16))

    # A CPU node cannot take nproc_per_node: gpu; one facts file stands for every node.
    r = subprocess.run([*NO_NET, DDPCTL, "launch", "--dry-run", "--nodes", "a,c", "--facts",
                        f"{fixtures / 'dgx-a.json'},{fixtures / 'cpu-a.json'}", str(job)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "nproc_per_node: gpu, but c has no GPU" in r.stderr, r.stderr
    plan = dry_run(tmp_path, job, "--nodes", "node[1-3]", "--facts", str(fixtures / "dgx-no-ib.json"))
    assert plan["world_size"] == 24 and plan["nccl_ib_hca"] is None
    assert [n["node"] for n in plan["nodes"]] == ["node1", "node2", "node3"]

    # Without --facts the plan asks the agents for their live facts (multinode/test_dry_run_nodes.py),
    # which takes the token: none here, and the launch says where it looked.
    r = subprocess.run([DDPCTL, "launch", "--dry-run", "--nodes", "a,b", str(job)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=30, env={k: v for k, v in os.environ.items()
                                                                         if k not in ("DDP_TOKEN_FILE", "XDG_CONFIG_HOME")})
    assert r.returncode == 2 and "no token file found" in r.stderr, r.stderr
