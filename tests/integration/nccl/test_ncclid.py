"""ddp-ncclid, the NCCL unique id holder, for real (issue 4, item 5).

Starts the holder as the launcher does (workers' env, NCCL_SOCKET_IFNAME=lo, stdin a pipe), reads
its one line, decodes the bootstrap address inside the id (here in Python, from NCCL 2.x's
ncclBootstrapHandle layout: u64 magic, then a sockaddr_in/in6, host-order family, network-order
port), checks it against the holder's own --decode, connects to it (NCCL's bootstrap root
listening inside the holder), then closes stdin and checks a clean exit and a closed port.
Skips cleanly where libnccl.so.2 cannot be loaded; the error path runs everywhere.
"""
import ctypes
import json
import os
import select
import signal
import socket
import struct
import subprocess

import pytest

BIN = os.path.join(os.environ.get("DDP_BINARY_DIR", "build"), "bin", "ddp-ncclid")
DEADLINE_S = 30


def nccl_loadable():
    try:
        ctypes.CDLL("libnccl.so.2")
        return True
    except OSError:
        return False


needs_nccl = pytest.mark.skipif(not nccl_loadable(), reason="libnccl.so.2 not loadable on this machine")


def decode(hex_id):
    raw = bytes.fromhex(hex_id)
    assert len(raw) == 128
    magic, family = struct.unpack_from("=QH", raw, 0)
    port = struct.unpack_from("!H", raw, 10)[0]
    if family == socket.AF_INET:
        ip = socket.inet_ntop(socket.AF_INET, raw[12:16])
    elif family == socket.AF_INET6:
        ip = socket.inet_ntop(socket.AF_INET6, raw[16:32])
    else:
        raise AssertionError(f"address family {family} in id")
    return {"magic": magic, "family": family, "ip": ip, "port": port}


def read_line(proc, timeout=DEADLINE_S):
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no line from ddp-ncclid within {timeout} s"
    return proc.stdout.readline().decode()


def start(extra_args=(), env_update=None):
    env = dict(os.environ)
    env["NCCL_SOCKET_IFNAME"] = "lo"
    env.pop("NCCL_COMM_ID", None)
    env.update(env_update or {})
    return subprocess.Popen([BIN, *extra_args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)


def connects(ip, port):
    try:
        with socket.create_connection((ip, port), timeout=5):
            return True
    except OSError:
        return False


def finish(proc, timeout=DEADLINE_S):
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@needs_nccl
def test_id_holder_serves_on_loopback_and_goes_away_on_eof():
    proc = start()
    try:
        line = read_line(proc)
        assert line.endswith("\n")
        hex_id = line.rstrip("\n")
        assert len(hex_id) == 256 and all(c in "0123456789abcdef" for c in hex_id), line
        addr = decode(hex_id)
        assert addr["family"] == socket.AF_INET
        assert addr["ip"] == "127.0.0.1"
        assert 0 < addr["port"] < 65536

        mine = json.loads(subprocess.run([BIN, "--decode", hex_id], capture_output=True, check=True,
                                         timeout=DEADLINE_S).stdout)
        assert mine["family"] == "ipv4" and mine["ip"] == addr["ip"] and mine["port"] == addr["port"]
        assert int(mine["magic"], 16) == addr["magic"]

        # A listener of the holder (NCCL's bootstrap root) on the workers' NCCL interface.
        assert connects(addr["ip"], addr["port"])
        assert proc.poll() is None, "a stray connection must not kill the holder"
        assert connects(addr["ip"], addr["port"]), "nor stop its root from accepting"

        proc.stdin.close()
        assert finish(proc) == 0
        assert proc.stdout.read() == b"", "nothing after the id line"
        assert not connects(addr["ip"], addr["port"]), "the root must be gone with the holder"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@needs_nccl
# The holder is in the launcher's process group: a terminal's Ctrl-\ and hangup reach it too.
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP])
def test_id_holder_exits_zero_on_stop_signals(sig):
    proc = start()
    try:
        addr = decode(read_line(proc).strip())
        proc.send_signal(sig)
        assert finish(proc) == 0
        assert not connects(addr["ip"], addr["port"])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@needs_nccl
def test_every_holder_gets_a_fresh_id():
    ids = []
    for _ in range(2):
        proc = start()
        ids.append(read_line(proc).strip())
        proc.stdin.close()
        assert finish(proc) == 0
    assert ids[0] != ids[1]
    assert decode(ids[0])["magic"] != decode(ids[1])["magic"]


LAUNCHER = r"""
import os, subprocess, sys
r, w = os.pipe()
# The holder's stdin stays open after this "launcher" dies (a sleeping child keeps the write
# end), so only PR_SET_PDEATHSIG can stop the holder.
keeper = subprocess.Popen(["sleep", "600"], pass_fds=(w,), start_new_session=True)
holder = subprocess.Popen([sys.argv[1], "--expect-parent", str(os.getpid())], stdin=r,
                          stdout=subprocess.PIPE)
os.close(r)
line = holder.stdout.readline().decode()
print(holder.pid, keeper.pid, line, end="", flush=True)
os.pause()
"""


@needs_nccl
def test_id_holder_dies_with_its_launcher():
    env = dict(os.environ, NCCL_SOCKET_IFNAME="lo")
    launcher = subprocess.Popen(["/usr/bin/python3", "-c", LAUNCHER, BIN], stdout=subprocess.PIPE, env=env)
    keeper_pid = None
    try:
        ready, _, _ = select.select([launcher.stdout], [], [], DEADLINE_S)
        assert ready, "the stand-in launcher printed nothing"
        holder_pid, keeper_pid, hex_id = launcher.stdout.readline().decode().split()
        holder_pid, keeper_pid = int(holder_pid), int(keeper_pid)
        addr = decode(hex_id)
        pidfd = os.pidfd_open(holder_pid)
        try:
            launcher.kill()
            launcher.wait()
            ready, _, _ = select.select([pidfd], [], [], DEADLINE_S)
            assert ready, "ddp-ncclid outlived its launcher"
        finally:
            os.close(pidfd)
        assert not connects(addr["ip"], addr["port"])
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        if keeper_pid:
            os.kill(keeper_pid, signal.SIGKILL)


def test_missing_nccl_is_a_clear_error_line():
    proc = start(["--nccl-lib", "/nonexistent/ddp-test/libnccl.so.2"])
    out, _ = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == 3
    lines = out.decode().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: cannot load NCCL from /nonexistent/ddp-test/libnccl.so.2")
    assert "install NCCL or set nccl.unique_id: off" in lines[0]


def test_not_serving_for_a_launcher_that_is_gone():
    proc = start(["--nccl-lib", "/nonexistent/libnccl.so.2", "--expect-parent", "1"])
    out, _ = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == 3
    assert out.decode().startswith("error: the launcher (pid 1) is gone")


def test_bad_flags_and_bad_ids_are_error_lines():
    for args in (["--no-such-flag"], ["--decode", "abc"], ["--decode", "0" * 256]):
        res = subprocess.run([BIN, *args], capture_output=True, timeout=DEADLINE_S)
        assert res.returncode == 3, args
        lines = res.stdout.decode().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, lines)
