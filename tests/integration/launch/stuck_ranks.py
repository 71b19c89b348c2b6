"""A gloo job whose ranks are somewhere known when ddpctl stops it (tests of the failure report's
stacks, issue 24). Copied next to the job by the tests (simulated hosts see only their folder).

  stuck_ranks.py exit RANK   rank RANK exits with code 3 once every other rank is blocked in
                             all_reduce (inside step()); its gloo connections stay open (a child
                             of it holds them, as a rank on a lost node would), so the others stay.
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
    """In the failing rank's child, its PyTorch side: keep its gloo connections open (the stop's
    SIGTERM is ignored) until a peer closes one, i.e. until the others were stopped; bounded.
    Only a hang-up is waited for (POLLRDHUP): the data stays for gloo's own thread to read."""
    poller = select.poll()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(int(fd)))
            with s:
                if s.family not in (socket.AF_INET, socket.AF_INET6) or s.type != socket.SOCK_STREAM:
                    continue
                if s.getpeername()[1] == int(os.environ["MASTER_PORT"]):  # the store may go first
                    continue
            poller.register(int(fd), select.POLLRDHUP)  # connected: not gloo's listener
        except OSError:
            pass
    poller.poll(120_000)
    os._exit(0)


if rank == odd and mode == "exit":
    # The rank's process only waits and exits; a child of it, which ignores the stop's SIGTERM,
    # is the rank's PyTorch side: its gloo connections stay open after the exit.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    ready_r, ready_w = os.pipe()
    if os.fork() != 0:
        os.close(ready_w)
        os.read(ready_r, 1)
        print(f"rank {rank} gives up", flush=True)
        os._exit(3)
    os.close(ready_r)
dist.init_process_group("gloo")
t = torch.ones(4)
if rank != odd:
    step(t)
elif mode == "exit":
    store.wait([f"at/{r}" for r in range(world) if r != odd])
    os.write(ready_w, b"x")
    hold_connections_until_a_peer_goes()
else:
    wait_for_the_data_loader()
