"""The raw-NCCL all-reduce example worker (issue 4, item 6).

Everywhere: its env contract errors and the missing-NCCL exit. On a machine with a GPU (the
GPU batch): one rank from an id made by ddp-ncclid, as ddpctl will hand it out, and one rank from
an id it makes itself (--self-id); both must check out ("#wrong" 0). Skips cleanly without a GPU.
"""
import ctypes
import os
import select
import subprocess

import pytest

BIN_DIR = os.path.join(os.environ.get("DDP_BINARY_DIR", "build"), "bin")
EXAMPLE = os.path.join(BIN_DIR, "nccl_allreduce")
HOLDER = os.path.join(BIN_DIR, "ddp-ncclid")
DEADLINE_S = 300


def loadable(name):
    try:
        ctypes.CDLL(name)
        return True
    except OSError:
        return False


def have_gpu():
    if not os.path.exists("/dev/nvidiactl") or not loadable("libnccl.so.2"):
        return False
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            rt = ctypes.CDLL(name)
        except OSError:
            continue
        n = ctypes.c_int(0)
        return rt.cudaGetDeviceCount(ctypes.byref(n)) == 0 and n.value > 0
    return False


needs_gpu = pytest.mark.skipif(not have_gpu(), reason="needs a GPU: no CUDA device here (tests/gpu runs it on the H200)")


def base_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "DDP_NCCL_UNIQUE_ID",
                        "MASTER_ADDR", "MASTER_PORT", "NCCL_COMM_ID")}
    env["NCCL_SOCKET_IFNAME"] = "lo"
    env.update(extra)
    return env


def test_contract_errors_name_every_missing_variable():
    res = subprocess.run([EXAMPLE], env=base_env(), capture_output=True, timeout=60)
    assert res.returncode in (1, 2), res  # 2: no CUDA runtime on this machine at all
    if res.returncode == 1:
        err = res.stderr.decode()
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "DDP_NCCL_UNIQUE_ID"):
            assert f"{name} is not set" in err, err
    else:
        assert "no CUDA runtime" in res.stderr.decode()


def test_missing_nccl_exits_2_with_the_reason():
    env = base_env(RANK="0", WORLD_SIZE="1")
    res = subprocess.run([EXAMPLE, "--self-id", "/nonexistent/id", "--nccl-lib", "/nonexistent/libnccl.so.2"],
                         env=env, capture_output=True, timeout=60)
    assert res.returncode == 2, res
    err = res.stderr.decode()
    assert "cannot load NCCL from /nonexistent/libnccl.so.2" in err or "no CUDA runtime" in err, err


def check_report(out):
    assert "# id: " in out and "ncclCommInitRank" in out, out
    rows = [l for l in out.splitlines() if l and not l.startswith("#")]
    assert rows, out
    for row in rows:
        size, count, typ, op, time_us, algbw, busbw, wrong = row.split()
        assert typ == "float" and op == "sum" and int(wrong) == 0, row
        assert int(size) == 4 * int(count) and float(time_us) > 0
    assert "Out of bounds values : 0 OK" in out, out


@needs_gpu
def test_one_rank_from_the_holders_id():
    holder = subprocess.Popen([HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=base_env())
    try:
        ready, _, _ = select.select([holder.stdout], [], [], 60)
        assert ready
        hex_id = holder.stdout.readline().decode().strip()
        assert len(hex_id) == 256, hex_id
        env = base_env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", DDP_NCCL_UNIQUE_ID=hex_id)
        res = subprocess.run([EXAMPLE, "-e", str(16 << 20)], env=env, capture_output=True, timeout=DEADLINE_S)
        print(res.stdout.decode(), res.stderr.decode())
        assert res.returncode == 0
        out = res.stdout.decode()
        check_report(out)
        assert "broadcast (DDP_NCCL_UNIQUE_ID)" in out
    finally:
        holder.stdin.close()
        assert holder.wait(timeout=60) == 0


@needs_gpu
def test_one_rank_with_its_own_id(tmp_path):
    env = base_env(RANK="0", WORLD_SIZE="1")
    id_file = tmp_path / "nccl.id"
    res = subprocess.run([EXAMPLE, "-e", str(16 << 20), "--self-id", str(id_file)], env=env, capture_output=True,
                         timeout=DEADLINE_S)
    print(res.stdout.decode(), res.stderr.decode())
    assert res.returncode == 0
    check_report(res.stdout.decode())
    assert "self (" in res.stdout.decode()
    assert not id_file.exists(), "rank 0 removes the id file at the end"
