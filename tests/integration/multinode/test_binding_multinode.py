"""Binding in a multi-node launch (issue 7): each agent plans its own ranks from its own node's
facts and the share it manages (--gpus, --cpus), and NCCL_IB_HCA is the set of IB devices every
node has. Both simulated hosts describe themselves through a recorded DGX H100 sysfs tree
(DDP_SYSFS_ROOT) whose two NUMA nodes are mapped onto this machine's CPUs 0 and 1, so the
planned CPUs can be applied for real and read back from inside the workers."""
import json
import os
import re
import shutil
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import simcluster  # noqa: E402

SKIP = simcluster.netns_unavailable()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

PY = "/usr/bin/python3"
WORKER = r'''
import json, os
status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
print("BOUND " + json.dumps({"rank": int(os.environ["RANK"]),
                             "cpus": status["Cpus_allowed_list"].strip(),
                             "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
                             "hca": os.environ.get("NCCL_IB_HCA")}), flush=True)
'''
UUID = "GPU-6a1e5f33-9c0b-4d7e-8a21-00000000100{}"


def dgx_tree(c, name, drop_hca=None):
    """The DGX H100 fixture with NUMA node 0 = CPU 0 and node 1 = CPU 1, outside /tmp (private per host)."""
    root = os.path.join(c.dir, name)
    shutil.copytree(os.path.join(simcluster.SRC, "tests", "fixtures", "sysfs", "dgx-h100"), root, symlinks=True)
    for node, cpu in ((0, "0"), (1, "1")):
        with open(os.path.join(root, "sys", "devices", "system", "node", f"node{node}", "cpulist"), "w") as f:
            f.write(cpu + "\n")
    if drop_hca:
        link = os.path.join(root, "sys", "class", "infiniband", drop_hca)
        os.unlink(link) if os.path.islink(link) else shutil.rmtree(link)
    return root


@pytest.fixture
def cluster():
    with simcluster.Cluster(nodes=2) as c:
        yield c


def test_each_agent_binds_its_share_and_the_ib_hcas_all_nodes_have(cluster):
    if not {0, 1} <= os.sched_getaffinity(0):
        pytest.skip("needs CPUs 0 and 1")
    c = cluster
    n1, n2 = c.hosts
    # n1 manages GPUs 4 and 5 (NUMA node 1, so CPU 1); n2 lacks mlx5_7 and manages only CPU 0.
    c.start_agent(n1, extra=["--gpus", f"4,{UUID.format(5)}"], env={"DDP_SYSFS_ROOT": dgx_tree(c, "tree1")})
    c.start_agent(n2, extra=["--cpus", "0"], env={"DDP_SYSFS_ROOT": dgx_tree(c, "tree2", drop_hca="mlx5_7")})
    worker = c.write("bound.py", WORKER)
    job = c.write("bound.yaml", f"name: bound\nnproc_per_node: gpu\ncommand: [{PY}, {worker}]\n"
                                "store: {port: 29500}\nbinding: {gpu: isolate, numa: node, nic: rank}\n")
    p = c.launch(job)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, out + err
    got = {}
    for line in out.splitlines():
        m = re.match(r"^\[[^\]]+\] BOUND (.*)$", line)
        if m:
            b = json.loads(m.group(1))
            got[b["rank"]] = b
    # nproc_per_node: gpu counts the GPUs each agent manages: 2 on n1, all 8 on n2.
    assert sorted(got) == list(range(10)), out + err
    # The job's binding crossed the wire: gpu: isolate (one GPU each), nic: rank (each rank's own
    # rail: the IB device on its GPU's PCI switch).
    for r in (0, 1):
        assert got[r]["cuda"] == UUID.format(4 + r), got[r]
        assert got[r]["cpus"] == "1", got[r]
        assert got[r]["hca"] == f"=mlx5_{4 + r}:1", got[r]
    for r in range(2, 10):
        assert got[r]["cuda"] == UUID.format(r - 2), got[r]
        assert got[r]["cpus"] == "0", got[r]  # NUMA node 0 or 1, narrowed to the CPU the agent manages
    # n2 lacks mlx5_7: its rank 7 takes another rail of its NUMA node
    assert got[9]["hca"] in {f"=mlx5_{i}:1" for i in (4, 5, 6)}, got[9]


def test_ib_hca_is_what_every_node_has(cluster):
    c = cluster
    n1, n2 = c.hosts
    c.start_agent(n1, env={"DDP_SYSFS_ROOT": dgx_tree(c, "tree1")})
    c.start_agent(n2, env={"DDP_SYSFS_ROOT": dgx_tree(c, "tree2", drop_hca="mlx5_7")})
    worker = c.write("bound.py", WORKER)
    job = c.write("hca.yaml", f"name: hca\nnproc_per_node: 1\ncommand: [{PY}, {worker}]\nstore: {{port: 29500}}\n")
    p = c.launch(job)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, out + err
    hcas = [json.loads(m.group(1))["hca"] for m in re.finditer(r"^\[[^\]]+\] BOUND (.*)$", out, re.M)]
    assert hcas == ["=" + ",".join(f"mlx5_{i}:1" for i in range(7))] * 2, out + err


def test_agent_refuses_a_gpu_it_does_not_have(cluster):
    c = cluster
    n1 = c.hosts[0]
    r = n1.run([os.path.join(c.bin, "ddp-agentd"), "--token-file", c.token, "--gpus", "0,9",
                "--listen", f"{n1.addr}:{simcluster.AGENT_PORT}"],
               env={**os.environ, "DDP_SYSFS_ROOT": dgx_tree(c, "tree")})
    assert r.returncode == 2
    assert "--gpus: GPU '9' is not on this node (8 GPUs" in r.stderr, r.stderr
