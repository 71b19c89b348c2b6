"""A rank of tests/gpu/flight_on_h200.sh: NCCL on one GPU shared by 2 ranks (each its own
NCCL_HOSTID, so NCCL sees two hosts and talks over sockets); three all_reduces together, then
rank 1 sleeps in Python while rank 0 waits in the fourth, until NCCL's timeout."""
import datetime
import os
import time

rank = int(os.environ["RANK"])
os.environ["NCCL_HOSTID"] = f"flight-host-{rank}"
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

torch.cuda.set_device(0)
dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=int(os.environ.get("FLIGHT_TIMEOUT_S", "30"))))
x = torch.ones(1 << 20, device="cuda")  # 4 MiB of float32
for _ in range(3):
    dist.all_reduce(x)
torch.cuda.synchronize()
print(f"rank {rank}: 3 all_reduce done", flush=True)
if rank == 1:
    print("rank 1: stuck in Python", flush=True)
    time.sleep(3600)
dist.all_reduce(x)
torch.cuda.synchronize()
print("rank 0: the fourth all_reduce completed (it should not have)", flush=True)
