#!/usr/bin/env python3
"""A real PyTorch client against ddpctl's store: every operation this PyTorch exposes, with
the answers checked. Optionally through a recording proxy that writes what crossed the wire
as a replayable fixture (tests/unit/store/fixtures/README.md's format).

  store_client_check.py --port P                 # check only
  store_client_check.py --port P --capture FILE  # check through a proxy, write the fixture
"""
import argparse
import datetime
import os
import socket
import sys
import threading

import torch
import torch.distributed as dist


class Recorder:
    """A one-connection-at-a-time TCP proxy that logs client->server and server->client bytes."""

    def __init__(self, upstream_port):
        self.upstream = upstream_port
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.steps = []  # (conn_no, direction, bytes)
        self.conns = 0
        threading.Thread(target=self.accept_loop, daemon=True).start()

    def accept_loop(self):
        while True:
            c, _ = self.listener.accept()
            self.conns += 1
            n = self.conns
            u = socket.create_connection(("127.0.0.1", self.upstream))
            for a, b, d in ((c, u, ">"), (u, c, "<")):
                threading.Thread(target=self.pump, args=(a, b, n, d), daemon=True).start()

    def pump(self, src, dst, n, d):
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            with self.lock:
                if self.steps and self.steps[-1][0] == n and self.steps[-1][1] == d:
                    self.steps[-1] = (n, d, self.steps[-1][2] + data)
                else:
                    self.steps.append((n, d, data))
            dst.sendall(data)

    def write(self, path, header):
        with open(path, "w") as f:
            f.write(f"# captured from a real client: {header}\n")
            for n, d, data in self.steps:
                f.write(f"{n}{d} {data.hex()}\n")


def check(port):
    results = []

    def ok(name, cond):
        results.append((name, bool(cond)))
        print(f"{'ok  ' if cond else 'FAIL'} {name}", flush=True)

    s = dist.TCPStore("127.0.0.1", port, world_size=1, is_master=False, timeout=datetime.timedelta(seconds=10))
    s.set("k", "v")
    ok("set/get", s.get("k") == b"v")
    ok("add creates", s.add("counter", 5) == 5)
    ok("add adds", s.add("counter", -2) == 3)
    ok("add stored decimal", s.get("counter") == b"3")
    ok("compare_set missing+empty expected stores desired", s.compare_set("cs", "", "new") == b"new")
    ok("compare_set mismatch returns current", s.compare_set("cs", "wrong", "x") == b"new")
    ok("compare_set match replaces", s.compare_set("cs", "new", "newer") == b"newer")
    ok("compare_set missing+expected returns expected", s.compare_set("nokey", "exp", "d") == b"exp")
    if hasattr(s, "check"):  # not bound in 1.13's Python API
        ok("check present", s.check(["k", "counter"]))
        ok("check missing", not s.check(["k", "absent"]))
    s.wait(["k"])
    ok("wait on present key returns", True)
    try:
        s.wait(["never"], datetime.timedelta(milliseconds=300))
        ok("wait times out", False)
    except Exception as e:  # DistStoreError in 2.x, RuntimeError in 1.13
        ok("wait times out", "timeout" in str(e).lower() or "Timeout" in str(e))
    s.set("after_cancel", "1")
    ok("connection usable after a cancelled wait", s.get("after_cancel") == b"1")
    ok("num_keys", s.num_keys() >= 4)
    ok("delete_key existing", s.delete_key("k") is True)
    ok("delete_key missing", s.delete_key("k") is False)
    if hasattr(s, "append"):
        s.append("ap", "a")
        s.append("ap", "b")
        ok("append", s.get("ap") == b"ab")
    if hasattr(s, "multi_set"):
        s.multi_set(["m1", "m2"], ["x", "y"])
        ok("multi_set/multi_get", s.multi_get(["m1", "m2"]) == [b"x", b"y"])
    if hasattr(s, "queue_push"):
        s.queue_push("q", "first")
        s.queue_push("q", "second")
        ok("queue_len", s.queue_len("q") == 2)
        ok("queue_pop order", s.queue_pop("q") == b"first")
        ok("queue_pop non-blocking", s.queue_pop("q", block=False) == b"second")
    if hasattr(s, "list_keys"):
        ok("list_keys", "/m1" in s.list_keys() or "m1" in s.list_keys())
    # a waiter released by another client's set
    t = dist.TCPStore("127.0.0.1", port, world_size=1, is_master=False, timeout=datetime.timedelta(seconds=10))
    th = threading.Thread(target=lambda: t.wait(["late"]))
    th.start()
    s.set("late", "now")
    th.join(5)
    ok("wait released by another client's set", not th.is_alive())
    return all(r for _, r in results)


def run_proxy(upstream, out):
    """The recorder runs in its own process: a client call that holds the GIL while it blocks
    on the socket would otherwise starve an in-process proxy."""
    rec = Recorder(upstream)
    print(rec.port, flush=True)
    sys.stdin.read()  # until the checking process closes our stdin
    rec.write(out, f"torch {torch.__version__} client, tests/gpu/store_client_check.py")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--capture", default="")
    ap.add_argument("--proxy", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.proxy:
        return run_proxy(args.port, args.capture)
    print(f"torch {torch.__version__}", flush=True)
    if args.capture:
        import subprocess
        proxy = subprocess.Popen([sys.executable, __file__, "--proxy", "--port", str(args.port), "--capture", args.capture],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        good = check(int(proxy.stdout.readline()))
        proxy.stdin.close()
        proxy.wait(30)
    else:
        good = check(args.port)
    print("ALL OK" if good else "SOME CHECKS FAILED", flush=True)
    sys.exit(0 if good else 1)


if __name__ == "__main__":
    main()
