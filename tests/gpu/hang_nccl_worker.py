"""One rank of tests/gpu/hang_on_h200.sh: NCCL, two ranks on the one GPU (each its own
NCCL_HOSTID, so NCCL takes them for two hosts). argv[1]: "hang" (rank 1 stuck_forever() in
Python, rank 0 waits in dist.barrier()), "hang-sync" (the same, rank 0 waiting for an all_reduce
in torch.cuda.synchronize(), outside torch.distributed), or "silent" (rank 0 computes silently
on the GPU for argv[2] seconds while rank 1 waits in barrier(); then both finish)."""
import os
import sys
import time

rank = int(os.environ["RANK"])
os.environ["NCCL_HOSTID"] = f"ddp-hang-test-{rank}"  # before NCCL starts: two "hosts" on one GPU

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def stuck_forever():
    while True:
        time.sleep(3600)


def gpu_compute(seconds):
    a = torch.randn(4096, 4096, device="cuda")
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        a = torch.tanh(a @ a)
        torch.cuda.synchronize()


torch.cuda.set_device(0)  # both ranks share the one GPU
dist.init_process_group("nccl")
t = torch.ones(4, device="cuda")
dist.all_reduce(t)  # NCCL is up on both ranks
torch.cuda.synchronize()
print(f"rank {rank} joined at {time.time():.3f}", flush=True)
if sys.argv[1].startswith("hang") and rank == 1:
    stuck_forever()
if sys.argv[1] == "silent" and rank == 0:
    gpu_compute(float(sys.argv[2]))
if sys.argv[1] == "hang-sync":
    dist.all_reduce(t)
    torch.cuda.synchronize()
else:
    dist.barrier()
print(f"rank {rank} done: {t[0].item():.0f}", flush=True)
dist.destroy_process_group()
