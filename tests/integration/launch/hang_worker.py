"""One rank of the hang watchdog's tests (test_hang.py, multinode/test_hang_nodes.py), gloo on CPU.

argv[1] is the scenario:
  hang      rank 1 is stuck_forever() in Python while the others wait in all_reduce
  fifo      rank 1 is stuck_until_fifo() (blocked opening argv[2], a FIFO the test opens to
            release it) while the others wait in all_reduce; then all finish
  once      as hang on the first attempt (TORCHELASTIC_RESTART_COUNT 0), healthy on a restart
  silent    rank 0 computes silently (no output) for argv[2] seconds in Python (its stack moves),
            then as long on one line of C calls (hashlib: its stack stands still, its CPU time
            runs) while the others wait in all_reduce; then all finish
"""
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist


def stuck_forever():
    while True:
        time.sleep(3600)


def stuck_until_fifo(path):
    with open(path, "rb") as f:  # blocks in open() until the test opens the other end
        f.read(1)


def python_compute(seconds):
    end, x = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        for i in range(2000):
            x = (x + i * i) % 1000003
    return x


def c_compute(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        hashlib.pbkdf2_hmac("sha256", b"ddpctl", b"salt", 200_000)


def main():
    scenario = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    print(f"rank {rank} joined", flush=True)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if rank == 1 and (scenario == "hang" or (scenario == "once" and restart == 0)):
        stuck_forever()
    if rank == 1 and scenario == "fifo":
        stuck_until_fifo(sys.argv[2])
    if rank == 0 and scenario == "silent":
        seconds = float(sys.argv[2])
        t0 = time.monotonic()
        python_compute(seconds)
        t1 = time.monotonic()
        c_compute(seconds)
        t2 = time.monotonic()
        print(f"computed silently: python {t1 - t0:.1f}s, c {t2 - t1:.1f}s", flush=True)
    t = torch.ones(4)
    dist.all_reduce(t)
    print(f"rank {rank} done: {t[0].item():.0f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
