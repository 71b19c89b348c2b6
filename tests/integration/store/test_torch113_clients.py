"""Debian's PyTorch 1.13 TCPStore clients against `ddpctl store serve`.

Every operation 1.13 exposes, waits released by other clients, client timeouts, 32 concurrent
client processes, bad clients (garbage, oversized lengths, vanishing mid-wait) while a good
client carries on, the wait report naming a real client's rank, and a 2-process gloo DDP run
through our store with TORCHELASTIC_USE_AGENT_STORE=True.
"""
import datetime
import multiprocessing
import os
import pathlib
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch.distributed as dist

from conftest import DDPCTL, StoreProcess

T = datetime.timedelta


def client(store, timeout=10, world_size=None):
    return dist.TCPStore(store.host, store.port, world_size, False, timeout=T(seconds=timeout))


def test_every_operation(store):
    s = client(store, world_size=1)  # with a world size, the client ADDs init/ on connect
    assert s.num_keys() == 1  # init/
    s.set("a", "hello")
    assert s.get("a") == b"hello"
    s.set("bin", bytes(range(256)))
    assert s.get("bin") == bytes(range(256))
    assert s.add("n", 5) == 5
    assert s.add("n", -7) == -2
    assert s.get("n") == b"-2"  # stored as decimal ASCII
    # compare_set's quirks
    assert s.compare_set("c", "", "first") == b"first"
    assert s.compare_set("m", "expected", "x") == b"expected"
    assert s.compare_set("c", "first", "second") == b"second"
    assert s.compare_set("c", "nope", "third") == b"second"
    assert s.get("c") == b"second"
    # wait
    s.wait(["a", "n"])
    s.wait(["a"], T(seconds=1))
    # delete_key / num_keys (m was never stored)
    keys_before = s.num_keys()
    assert s.delete_key("a") is True
    assert s.delete_key("a") is False
    assert s.num_keys() == keys_before - 1
    # PyTorch's own limits: 8 KiB key, 8 MiB value
    big_key, big_value = "k" * 8192, os.urandom(8 << 20)
    s.set(big_key, big_value)
    assert s.get(big_key) == big_value
    s.set_timeout(T(seconds=3))
    assert s.timeout == T(seconds=3)


def test_wait_released_by_another_clients_set(store):
    waiter, setter = client(store), client(store)
    done = {}

    def wait():
        t = time.monotonic()
        waiter.wait(["go", "also"])
        done["after"] = time.monotonic() - t
        done["value"] = waiter.get("go")

    th = threading.Thread(target=wait)
    th.start()
    store.wait_for_waiter("go")
    setter.set("go", "1")
    store.wait_for_waiter("also")  # still waiting, now on the key that is missing
    assert th.is_alive(), "released before every key existed"
    setter.add("also", 1)
    th.join(timeout=10)
    assert not th.is_alive()
    assert done["value"] == b"1"
    assert done["after"] < 5


def test_client_timeout_then_clean_replies(store):
    s, other = client(store), client(store)
    t = time.monotonic()
    with pytest.raises(RuntimeError, match="[Tt]imeout"):
        s.wait(["never"], T(seconds=1))
    assert 0.9 < time.monotonic() - t < 5
    # 1.13 has no CANCEL_WAIT: the client's next request tells the server it gave up, and the
    # server drops the wait, so the key arriving later sends no stale STOP_WAITING byte (with
    # PyTorch's own server it would, and this add() would read 0x0300 = 768). A key arriving
    # *before* that next request cannot be told apart from a wait still wanted; no server can.
    assert s.add("counter", 3) == 3
    other.set("never", "late")
    assert s.add("counter", 1) == 4
    assert s.get("never") == b"late"
    assert s.num_keys() == 2
    # get() is WAIT + GET under the client's own timeout.
    s.set_timeout(T(seconds=1))
    with pytest.raises(RuntimeError, match="[Tt]imeout"):
        s.get("absent")
    assert s.num_keys() == 2
    other.set("absent", "here")
    assert s.get("absent") == b"here"


def _worker(host, port, i, n, q):
    try:
        s = dist.TCPStore(host, port, n, False, timeout=T(seconds=30))
        s.add("arrived", 1)
        s.set(f"rank/{i}", str(i))
        s.wait([f"rank/{j}" for j in range(n)])
        values = [s.get(f"rank/{j}") for j in range(n)]
        assert values == [str(j).encode() for j in range(n)]
        s.add("done", 1)
        q.put((i, "ok"))
    except Exception as e:  # reported to the parent
        q.put((i, repr(e)))


def test_32_concurrent_client_processes(store):
    n = 32
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(store.host, store.port, i, n, q)) for i in range(n)]
    for p in procs:
        p.start()
    results = dict(q.get(timeout=60) for _ in range(n))
    for p in procs:
        p.join(timeout=30)
    assert results == {i: "ok" for i in range(n)}
    s = client(store)
    assert s.get("arrived") == b"32"
    assert s.get("done") == b"32"
    assert "init/" in _list_keys(store)  # each client's connect-time ADD (no "/" prefix)


def _raw(store):
    sk = socket.create_connection((store.host, store.port), timeout=5)
    return sk


def _closed_by_server(sk, timeout=5):
    sk.settimeout(timeout)
    try:
        return sk.recv(1) == b""
    except ConnectionResetError:
        return True


def test_bad_clients_are_closed_and_nobody_else_notices(store, tmp_path):
    good = client(store)
    good.set("before", "1")
    # Garbage: an opcode that fits neither protocol.
    g = _raw(store)
    g.sendall(b"\x0d garbage")
    assert _closed_by_server(g)
    store.wait_for_log("unknown opcode 13")
    # The refusal says why no release fits (issue 25: the layouts of docs/store-protocol.md).
    assert "this client sent no VALIDATE, so it is 1.13–2.1, whose opcodes end at 11" in store.log_text()
    # Oversized: a GET whose key claims 1 TiB, then nothing: closed without waiting for it.
    o = _raw(store)
    o.sendall(b"\x02" + struct.pack("<Q", 1 << 40))
    assert _closed_by_server(o, timeout=2)
    # A 2.x-style client sending a huge MULTI_GET count.
    m = _raw(store)
    m.sendall(b"\x00\xce\xf7\x85\x3c" + b"\x0a" + struct.pack("<Q", 1 << 62))
    assert _closed_by_server(m, timeout=2)
    # A raw client vanishing mid-wait.
    w = _raw(store)
    w.sendall(b"\x05" + struct.pack("<Q", 1) + struct.pack("<Q", 6) + b"/never")
    store.wait_for_waiter("/never")
    w.close()
    store.wait_for_log("went away while waiting")
    # A real 1.13 client killed mid-wait.
    script = textwrap.dedent(f"""
        import datetime, torch.distributed as d
        s = d.TCPStore("{store.host}", {store.port}, None, False, timeout=datetime.timedelta(seconds=60))
        print("waiting", flush=True)
        s.wait(["/also-never"])
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "waiting"
    store.wait_for_waiter("/also-never")
    gone_before = store.log_text().count("went away while waiting")
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=10)
    deadline = time.monotonic() + 10
    while store.log_text().count("went away while waiting") == gone_before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert store.log_text().count("went away while waiting") > gone_before
    # The good client carries on, with its state intact.
    assert good.get("before") == b"1"
    good.set("never", "now")
    good.set("/also-never", "now")
    assert good.add("after", 1) == 1


def test_wait_report_names_the_waiting_rank(store):
    script = textwrap.dedent(f"""
        import datetime, torch.distributed as d
        s = d.TCPStore("{store.host}", {store.port}, None, False, timeout=datetime.timedelta(seconds=60))
        print("waiting", flush=True)
        s.wait(["nobody_sets_this"])
    """)
    env = dict(os.environ, RANK="3")
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert p.stdout.readline().strip() == "waiting"
        text = store.wait_for_waiter("/nobody_sets_this")
        line = next(l for l in text.splitlines() if "nobody_sets_this" in l)
        assert "1 client waiting on `/nobody_sets_this` for " in line
        assert "(rank 3)" in line
        assert line.endswith("set by nobody")
    finally:
        p.kill()
        p.wait()


DDP_SCRIPT = textwrap.dedent("""
    import os, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group(backend="gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        x = torch.full((8, 4), float(rank + step))
        loss = model(x).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
    # Gradients were averaged: every rank holds the same weights.
    w = model.module.weight.detach().clone()
    ws = [torch.zeros_like(w) for _ in range(world)]
    dist.all_gather(ws, w)
    assert all(torch.equal(ws[0], x) for x in ws), ws
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} ok", flush=True)
""")


def test_gloo_ddp_through_our_store(store, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(DDP_SCRIPT)
    procs = []
    for rank in range(2):
        env = dict(os.environ, MASTER_ADDR=store.host, MASTER_PORT=str(store.port), RANK=str(rank),
                   LOCAL_RANK=str(rank), WORLD_SIZE="2", TORCHELASTIC_USE_AGENT_STORE="True",
                   TORCHELASTIC_RESTART_COUNT="0", GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        outs.append(out)
        assert p.returncode == 0, out
    assert "rank 0 ok" in outs[0] and "rank 1 ok" in outs[1]
    # The workers were clients under the agent store's per-attempt prefix (no rank hosted a
    # server on MASTER_PORT). LIST_KEYS over a 2.x connection on the same port shows them.
    keys = _list_keys(store)
    assert "init/" in keys
    assert any(k.startswith("//worker/attempt_0/") for k in keys), keys
    assert "closing client" not in store.log_text()


def _list_keys(store):
    sk = _raw(store)
    sk.sendall(b"\x00\xce\xf7\x85\x3c" + bytes([17]))  # VALIDATE, LIST_KEYS

    def read(n):
        data = b""
        while len(data) < n:
            chunk = sk.recv(n - len(data))
            assert chunk, "closed"
            data += chunk
        return data

    (count,) = struct.unpack("<q", read(8))
    keys = []
    for _ in range(count):
        (length,) = struct.unpack("<Q", read(8))
        keys.append(read(length).decode(errors="replace"))
    sk.close()
    return keys


def test_port_in_use_and_bad_allow_list(store, tmp_path):
    r = subprocess.run([str(DDPCTL), "store", "serve", "--listen", f"127.0.0.1:{store.port}"],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 2
    assert f"store port {store.port} on 127.0.0.1 is already in use" in r.stderr
    r = subprocess.run([str(DDPCTL), "store", "serve", "--listen", "127.0.0.1:0", "--allow", "node1"],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 2
    assert "`node1` is not an IP address" in r.stderr
