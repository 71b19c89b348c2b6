#!/usr/bin/env python3
"""The standard DDP training script, in the shape ddpctl serves unchanged (as torchrun would).

gloo on CPU, nccl when CUDA is there. A small regression model on synthetic data, sharded by
DistributedSampler; rank 0 saves a checkpoint after every epoch (atomically), and every rank
resumes from it whenever it exists, so a job restarted by the launcher continues where it
stopped and ends with the same parameters as an uninterrupted run. Whenever, not only when
TORCHELASTIC_RESTART_COUNT > 0: an elastic job (nnodes MIN:MAX) that loses a node re-forms
without spending a restart (as torchrun's does), and the count stays where it was. The path
holds the job's run id, so a new job never finds an old job's checkpoint.

Test hooks (off by default):
  --crash RANK:EPOCH   on the first attempt only, that rank dies (exit 3) at the start of EPOCH,
                       at once, as a crash would: sys.exit would first tear the interpreter down,
                       closing its gloo sockets while it is still alive, and a peer that saw
                       them close could exit before it and be the first failure
  --dump-params FILE   each rank writes its final parameters as JSON to FILE with {rank} filled
"""
import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def make_dataset(n=2048, features=16, seed=1234):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, features, generator=g)
    true_w = torch.randn(features, 1, generator=g)
    y = x @ true_w + 0.05 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def save_checkpoint(path, model, optimizer, epoch):
    tmp = f"{path}.tmp"
    torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, tmp)
    os.replace(tmp, path)  # a crash mid-save never leaves a torn checkpoint


@record
def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--checkpoint", default="checkpoints/{run_id}.pt",
                   help="checkpoint file, rank 0 writes it; {run_id} is the job's id")
    p.add_argument("--crash", default="", help="RANK:EPOCH, first attempt only")
    p.add_argument("--dump-params", default="")
    args = p.parse_args()
    args.checkpoint = args.checkpoint.format(run_id=os.environ.get("TORCHELASTIC_RUN_ID", "local"))
    os.makedirs(os.path.dirname(args.checkpoint) or ".", exist_ok=True)

    use_cuda = torch.cuda.is_available()
    dist.init_process_group(backend="nccl" if use_cuda else "gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(local_rank)

    torch.manual_seed(0)  # identical initial weights on every rank (DDP also broadcasts rank 0's)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to(device)
    model = DDP(model, device_ids=[local_rank] if use_cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

    start_epoch = 0
    if os.path.exists(args.checkpoint):
        ckpt = torch.load(args.checkpoint, map_location=device)
        model.module.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        start_epoch = ckpt["epoch"] + 1
        if rank == 0:
            print(f"resumed from {args.checkpoint} at epoch {start_epoch} (restart {restart_count}, "
                  f"attempt {os.environ.get('DDP_ATTEMPT', '?')})", flush=True)

    dataset = make_dataset()
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    crash_rank, crash_epoch = (int(v) for v in args.crash.split(":")) if args.crash else (-1, -1)

    for epoch in range(start_epoch, args.epochs):
        if restart_count == 0 and rank == crash_rank and epoch == crash_epoch:
            print(f"rank {rank}: crashing at epoch {epoch} as asked", flush=True)
            os._exit(3)
        sampler.set_epoch(epoch)
        total, batches = 0.0, 0
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            total += loss.item()
            batches += 1
        # the mean loss over all ranks, for one honest number per epoch
        mean = torch.tensor([total / max(batches, 1)], device=device)
        dist.all_reduce(mean)
        if rank == 0:
            print(f"epoch {epoch} loss {mean.item() / world:.6f}", flush=True)
            save_checkpoint(args.checkpoint, model, optimizer, epoch)
        dist.barrier()  # nobody runs ahead of a checkpoint that is not on disk yet

    if args.dump_params:
        flat = torch.cat([p.detach().cpu().flatten() for p in model.module.parameters()]).tolist()
        with open(args.dump_params.format(rank=rank), "w") as f:
            json.dump({"rank": rank, "world_size": world, "params": flat}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
