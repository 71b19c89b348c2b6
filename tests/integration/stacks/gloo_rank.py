"""One rank of tests/integration/stacks' hang: rank 0 calls all_reduce from step() and waits
there for rank 1, which is stuck_here(), blocked reading the pipe the test holds (its fd in STACKS_TEST_FD)."""
import os
import sys

import torch
import torch.distributed as dist

FD = int(os.environ["STACKS_TEST_FD"])


def stuck_here():
    os.read(FD, 1)  # STUCK_LINE


def step(t):
    dist.all_reduce(t)  # ALL_REDUCE_LINE
    return t


def main():
    rank, port = int(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    print("joined", flush=True)
    if rank == 1:
        stuck_here()
    else:
        step(torch.ones(4))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
