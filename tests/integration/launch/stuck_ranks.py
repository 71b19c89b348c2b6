"""A gloo job whose ranks are somewhere known when ddpctl stops it (tests of the failure report's
stacks, issue 24). Copied next to the job by the tests (simulated hosts see only their folder).

  stuck_ranks.py exit RANK   rank RANK exits with code 3 once every other rank is blocked in
                             all_reduce (inside step()); its gloo connections stay open (a child
                             holds them, as a rank on a lost node would), so the others stay there.
  stuck_ranks.py sleep RANK  rank RANK sleeps in wait_for_the_data_loader() while the others block
                             in all_reduce; every rank prints "AT <where>" once it is there.

Each rank says it arrived from a profile hook on the call that blocks ('c_call' of work.wait or
time.sleep): after it no Python frame is pushed, so the stack a reader sees is the one the test
expects, however late the reader comes.
"""
import datetime
import os
import select
import signal
import socket
import sys
import time

import torch
import torch.distributed as dist

mode, odd = sys.argv[1], int(sys.argv[2])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None, False,
                      timeout=datetime.timedelta(seconds=120))


def announce_when_blocked(function, blocking_call):
    def hook(frame, event, arg):
        if event == "c_call" and frame.f_code.co_name == function and getattr(arg, "__name__", "") == blocking_call:
            sys.setprofile(None)
            store.set(f"at/{rank}", function)
            print(f"AT {function}", flush=True)
    sys.setprofile(hook)


def step(t):
    announce_when_blocked("all_reduce", "wait")
    dist.all_reduce(t)  # STEP_LINE


def wait_for_the_data_loader():
    announce_when_blocked("wait_for_the_data_loader", "sleep")
    time.sleep(600)  # LOADER_LINE


def hold_connections_until_a_peer_goes():
    """In a child of the failing rank: keep its gloo connections open (and ignore the stop's
    SIGTERM) until a peer closes one, i.e. until the others were stopped; bounded."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    socks = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(int(fd)))
            if s.family in (socket.AF_INET, socket.AF_INET6) and s.type == socket.SOCK_STREAM:
                s.getpeername()  # connected (not gloo's listener)
                socks.append(s)
        except OSError:
            pass
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select(socks, [], [], max(0.0, deadline - time.monotonic()))
        for s in ready:
            try:
                if not s.recv(65536, socket.MSG_DONTWAIT):
                    os._exit(0)
            except BlockingIOError:
                pass
            except OSError:
                os._exit(0)
    os._exit(0)


dist.init_process_group("gloo")
t = torch.ones(4)
if rank != odd:
    step(t)
elif mode == "exit":
    store.wait([f"at/{r}" for r in range(world) if r != odd])
    if os.fork() == 0:
        hold_connections_until_a_peer_goes()
    print(f"rank {rank} gives up", flush=True)
    sys.exit(3)
else:
    wait_for_the_data_loader()
