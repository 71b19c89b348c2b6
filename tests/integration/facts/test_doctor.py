"""ddpctl doctor end to end: discovery on fixture trees and on this machine, facts files,
consistency across nodes and the exit status."""
import json
import os
import subprocess

import pytest

SRC = os.environ.get("DDP_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
BIN = os.path.join(os.environ.get("DDP_BINARY_DIR", os.path.join(SRC, "build")), "bin", "ddpctl")
SYSFS = os.path.join(SRC, "tests", "fixtures", "sysfs")
FACTS = os.path.join(SRC, "tests", "fixtures", "facts")


def doctor(*args, env=None):
    e = dict(os.environ)
    e.pop("DDP_SYSFS_ROOT", None)
    e.update(env or {})
    return subprocess.run([BIN, "doctor", *args], capture_output=True, text=True, timeout=60, env=e)


def facts_args(*names):
    out = []
    for n in names:
        out += ["--facts", os.path.join(FACTS, n + ".json")]
    return out


def test_dgx_fixture_json():
    r = doctor("--json", "--sysfs-root", os.path.join(SYSFS, "dgx-h100"))
    assert r.returncode == 0, r.stderr
    f = json.loads(r.stdout)
    assert f["hostname"] == "dgx-h100-01"
    assert [n["cpus"] for n in f["numa_nodes"]] == ["0-55,112-167", "56-111,168-223"]
    assert len(f["gpus"]) == 8
    assert [g["numa_node"] for g in f["gpus"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert f["gpus"][0]["pci_bus_id"] == "0000:18:00.0"
    assert f["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3"
    assert f["gpus"][0]["uuid"].startswith("GPU-")
    ib = [n for n in f["nics"] if n["kind"] == "ib"]
    eth = [n for n in f["nics"] if n["kind"] == "eth"]
    assert [n["name"] for n in ib] == ["mlx5_%d" % i for i in range(8)]
    assert all(n["state"] == "active" and n["speed_mbps"] == 400000 for n in ib)
    assert [n["name"] for n in eth] == ["eno1", "eno2"]
    assert f["versions"]["driver"] == "550.54.15"
    assert f["limits"]["memlock"]["soft"] == "unlimited"
    assert "docker" in f["container_runtimes"]


def test_uneven_fixture_and_env_root():
    r = doctor("--json", env={"DDP_SYSFS_ROOT": os.path.join(SYSFS, "amd-uneven")})
    assert r.returncode == 0, r.stderr
    f = json.loads(r.stdout)
    assert len(f["numa_nodes"]) == 8
    assert [g["numa_node"] for g in f["gpus"]] == [1, 2, 6, 7]
    assert f["versions"]["driver"] == "570.124.06"


def test_cpu_only_fixture_table():
    r = doctor("--sysfs-root", os.path.join(SYSFS, "cpu-only"))
    assert r.returncode == 0, r.stderr
    assert "node cpu-node-3" in r.stdout
    assert "GPUs (0)" in r.stdout
    assert "CPU job" in r.stdout
    assert "ok: no problems found" in r.stdout


def test_live_machine():
    r = doctor()
    assert r.returncode in (0, 1), r.stderr
    assert "NUMA nodes" in r.stdout
    j = doctor("--json")
    f = json.loads(j.stdout)
    assert f["hostname"]
    assert f["numa_nodes"] and all("cpus" in n for n in f["numa_nodes"])
    cpus = sum(len(range(int(a), int(b or a) + 1)) for n in f["numa_nodes"] if n["cpus"]
               for a, _, b in (p.partition("-") for p in n["cpus"].split(",")))
    assert cpus == os.cpu_count()
    assert f["limits"]["nofile"]["soft"] != 0
    if os.path.exists("/usr/local/cuda/lib/libnccl.so.2") or os.path.exists("/usr/local/cuda/lib64/libnccl.so.2"):
        assert f["versions"].get("nccl", "").startswith("2.")
    # What doctor --json prints is a facts file that doctor --facts reads back.
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "ddp-doctor-live-%d.json" % os.getpid())
    try:
        with open(path, "w") as fh:
            fh.write(j.stdout)
        back = doctor("--json", "--facts", path)
        assert json.loads(back.stdout) == f
    finally:
        os.unlink(path)


def test_clean_pair_passes():
    r = doctor(*facts_args("dgx-a", "dgx-b"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok: no problems found" in r.stdout


@pytest.mark.parametrize("odd,code,text", [
    ("dgx-driver", "driver-version-mismatch", "550.54.15 on dgx-a, dgx-b; 535.161.08 on dgx-c"),
    ("dgx-nccl", "nccl-version-mismatch", "2.21.5 on dgx-a, dgx-b; 2.19.3 on dgx-e"),
    ("dgx-gpu-missing", "gpu-count-mismatch", "7 GPUs on dgx-d"),
    ("dgx-no-ib", "nic-kind-mismatch", "RDMA (ib) on dgx-a, dgx-b but not on dgx-f"),
])
def test_mismatch_exits_1_and_names_nodes_and_values(odd, code, text):
    r = doctor(*facts_args("dgx-a", "dgx-b", odd))
    assert r.returncode == 1, r.stdout + r.stderr
    assert text in r.stdout
    assert code in r.stdout
    j = doctor("--json", *facts_args("dgx-a", "dgx-b", odd))
    assert j.returncode == 1
    report = json.loads(j.stdout)
    assert report["ok"] is False
    assert [n["hostname"] for n in report["nodes"]][:2] == ["dgx-a", "dgx-b"]
    errs = [f for f in report["findings"] if f["severity"] == "error"]
    assert [f["code"] for f in errs] == [code]
    assert text in errs[0]["message"]


def test_cpu_job_flag_and_unknown_fields():
    r = doctor(*facts_args("dgx-a", "cpu-a"))
    assert r.returncode == 1
    assert "cpu-a has none" in r.stdout
    r = doctor("--cpu-job", *facts_args("dgx-a", "cpu-a"))
    assert r.returncode == 0, r.stdout
    r = doctor(*facts_args("cpu-a", "cpu-future"))
    assert r.returncode == 0
    assert "unknown field 'power_watts' ignored" in r.stderr


def test_bad_input_and_nodes_usage():
    # --nodes asks the agents (tests/integration/multinode/test_doctor_nodes.py); here only its
    # usage errors, which stop before any connection is made.
    r = doctor("--nodes", "node1,node2", "--sysfs-root", os.path.join(SYSFS, "cpu-only"))
    assert r.returncode == 2 and "--nodes asks the agents; it excludes --facts and --sysfs-root" in r.stderr, r.stderr
    r = doctor("--nodes", "node1,node2", "--token-file", "/nonexistent/token")
    assert r.returncode == 2 and "/nonexistent/token" in r.stderr, r.stderr
    bad = os.path.join(os.environ.get("TMPDIR", "/tmp"), "ddp-doctor-bad-%d.json" % os.getpid())
    try:
        with open(bad, "w") as fh:
            json.dump({"hostname": "x", "numa_nodes": [], "gpus": [{"index": 0, "pci_bus_id": "nope"}], "nics": []}, fh)
        r = doctor("--facts", bad)
        assert r.returncode == 2
        assert bad in r.stderr and "gpus[0].pci_bus_id" in r.stderr
    finally:
        os.unlink(bad)


def test_missing_inputs_are_usage_errors():
    r = doctor("--facts", "/nonexistent/node.json")
    assert r.returncode == 2
    assert "/nonexistent/node.json: cannot read facts file" in r.stderr
    r = doctor("--sysfs-root", "/nonexistent/root")
    assert r.returncode == 2
    assert "not a directory" in r.stderr
