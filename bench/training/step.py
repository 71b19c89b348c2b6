"""The training script bench/training/run.py starts, by hand and through ddpctl: an unchanged
torchrun-style DDP script (env:// from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK).

It writes one JSON file (--out) of CLOCK_MONOTONIC timestamps (time.monotonic(), one clock for
every process of the machine, so the harness can subtract the instant it asked for the process):
  t_main          the script's first line (interpreter up, nothing imported)
  t_imported      torch imported
  t_device        the device set (on a GPU: torch.cuda.set_device, which makes the CUDA context)
  t_init          init_process_group returned
  t_model         model and synthetic batch built on the device
  t_ready         the DDP wrapper (its first collectives: NCCL's communicator) and the optimizer
                  made, the device synchronised
  t_step1         the end of step 1: forward, backward, optimizer step, then the device synchronised
  steady          the steady window: --steps steps after --warmup, timed as a whole between two
                  device synchronisations (no synchronisation inside, as a real loop runs), and in
                  --chunks equal parts for the spread within the run; and each step of it on
                  its own (CUDA events recorded between steps, read after the window: the GPU's
                  time from one step's end to the next's, with no synchronisation added), whose
                  median is the run's typical step, untouched by a few disturbed ones
  t_steady        the steady window's start and end
and what ran: model, parameters, batch, dtype, backend, device name, torch version, CPU affinity;
at each of those instants the process's CPU time, page faults and context switches (getrusage),
and, at the end, where it ran (allowed CPUs and memory nodes, its mappings' memory
policies, its cgroup, transparent huge pages in use).

Model: ResNet-50 (torchvision) when importable and --model auto/resnet50; otherwise a stack of
transformer blocks written here in plain torch (pre-norm attention + GELU MLP). Synthetic data,
made once on the device. bf16 through autocast, fp32 weights (the usual mixed precision).
cuDNN chooses its convolution algorithms by its heuristics unless --cudnn-benchmark: timed in each
process, the choice can differ from one run to the next, and with it the step time, by more than
the launcher could ever change it.
"""
import resource
import time

T_MAIN = time.monotonic()
U_MAIN = resource.getrusage(resource.RUSAGE_SELF)

import os  # noqa: E402

ENV0 = dict(os.environ)  # as the launcher gave it, before torch's import can add anything

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

T_IMPORTED = time.monotonic()
U_IMPORTED = resource.getrusage(resource.RUSAGE_SELF)


def usage(u):
    """The process's CPU time, page faults and context switches so far (getrusage, all threads)."""
    return {"user_s": u.ru_utime, "sys_s": u.ru_stime, "minflt": u.ru_minflt, "majflt": u.ru_majflt,
            "nvcsw": u.ru_nvcsw, "nivcsw": u.ru_nivcsw}


def placement():
    """Where the process may run and how its memory is placed: its allowed CPUs and memory nodes,
    the memory policies of its mappings (numa_maps: "default", or "prefer:0" under a launcher's
    set_mempolicy), its cgroup, and transparent huge pages in use."""
    out = {}
    try:
        for line in open("/proc/self/status"):
            k, _, v = line.partition(":")
            if k in ("Cpus_allowed_list", "Mems_allowed_list"):
                out[k] = v.strip()
    except OSError:
        pass
    try:
        out["numa_policies"] = sorted({line.split()[1] for line in open("/proc/self/numa_maps") if len(line.split()) > 1})
    except OSError:
        out["numa_policies"] = None
    try:
        lines = open("/proc/self/cgroup").read().split()
        out["cgroup"] = next((x[3:] for x in lines if x.startswith("0::")), " ".join(lines))  # v2's line
    except OSError:
        pass
    try:
        out["anon_huge_kb"] = next(int(line.split()[1]) for line in open("/proc/self/smaps_rollup")
                                   if line.startswith("AnonHugePages:"))
    except (OSError, StopIteration):
        out["anon_huge_kb"] = None
    return out


class Block(nn.Module):
    """A pre-norm transformer block: multi-head self-attention and a 4x GELU MLP."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        if hasattr(F, "scaled_dot_product_attention"):  # PyTorch 2.0 and later
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # 1.13 (the CPU smoke test here)
            w = (q @ k.transpose(-2, -1)) / (d // self.heads) ** 0.5
            w = w.masked_fill(torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
            a = w.softmax(-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Transformer(nn.Module):
    def __init__(self, vocab, d, heads, layers):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens):
        x = self.emb(tokens)
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


# name: (d, heads, layers, vocab, seq, batch); "tiny" is the CPU smoke test's.
TRANSFORMERS = {"transformer": (1024, 16, 8, 32768, 1024, 16), "tiny": (64, 4, 2, 256, 32, 4)}


def build(kind, device, batch):
    """Returns (model, inputs, targets, loss_fn, description)."""
    if kind == "auto":
        try:
            import torchvision  # noqa: F401

            kind = "resnet50"
        except ImportError:
            kind = "transformer"
    g = torch.Generator(device="cpu").manual_seed(0)
    if kind == "resnet50":
        import torchvision

        model = torchvision.models.resnet50(weights=None, num_classes=1000)
        batch = batch or 128
        x = torch.randn(batch, 3, 224, 224, generator=g).to(device).to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (batch,), generator=g).to(device)
        model = model.to(device).to(memory_format=torch.channels_last)
        desc = f"torchvision {torchvision.__version__} resnet50, batch {batch}, 224x224, channels_last"
        return model, x, y, lambda out, y: F.cross_entropy(out, y), desc
    d, heads, layers, vocab, seq, default_batch = TRANSFORMERS[kind]
    batch = batch or default_batch
    model = Transformer(vocab, d, heads, layers).to(device)
    x = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
    y = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
    desc = f"{kind}: {layers} blocks (plain torch), d {d}, {heads} heads, seq {seq}, vocab {vocab}, batch {batch}"
    return model, x, y, lambda out, y: F.cross_entropy(out.flatten(0, 1).float(), y.flatten()), desc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="the JSON file this run writes")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--model", default="auto", choices=["auto", "resnet50", "transformer", "tiny"])
    ap.add_argument("--batch", type=int, default=0, help="0: the model's default")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--warmup", type=int, default=10, help="steps after step 1 before the steady window")
    ap.add_argument("--steps", type=int, default=50, help="steps in the steady window")
    ap.add_argument("--chunks", type=int, default=5)
    ap.add_argument("--cudnn-benchmark", action="store_true",
                    help="let cuDNN time its algorithms in each process (off: its heuristics choose, the same each run)")
    a = ap.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if a.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        backend = "nccl"
        torch.backends.cudnn.benchmark = a.cudnn_benchmark
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

        def sync():
            torch.cuda.synchronize(device)
    else:
        device = torch.device("cpu")
        backend = "gloo"

        def sync():
            pass

    t_device = time.monotonic()
    u_device = resource.getrusage(resource.RUSAGE_SELF)
    dist.init_process_group(backend)  # env://, as torchrun's scripts do
    t_init = time.monotonic()
    u_init = resource.getrusage(resource.RUSAGE_SELF)

    model, x, y, loss_fn, desc = build(a.model, device, a.batch)
    sync()
    t_model = time.monotonic()
    u_model = resource.getrusage(resource.RUSAGE_SELF)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if a.device == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3, momentum=0.9)
    sync()
    t_ready = time.monotonic()
    u_ready = resource.getrusage(resource.RUSAGE_SELF)
    amp = torch.autocast(device_type=a.device, dtype=torch.bfloat16, enabled=a.dtype == "bf16")

    def step():
        opt.zero_grad(set_to_none=True)
        with amp:
            out = ddp(x)
        loss = loss_fn(out, y)
        loss.backward()
        opt.step()
        return loss

    step()
    sync()
    t_step1 = time.monotonic()
    u_step1 = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(a.warmup):
        step()
    sync()
    per_chunk = max(1, a.steps // a.chunks)
    chunks = []
    cuda = a.device == "cuda"
    marks = []  # CUDA events (on the GPU's clock) or, on the CPU, time.monotonic() readings

    def mark():
        if cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            marks.append(e)
        else:
            marks.append(time.monotonic())

    t0 = time.monotonic()
    mark()
    for _ in range(a.chunks):
        c0 = time.monotonic()
        for _ in range(per_chunk):
            loss = step()
            mark()
        sync()
        chunks.append((time.monotonic() - c0) / per_chunk)
    t1 = time.monotonic()
    steady = (t1 - t0) / (per_chunk * a.chunks)
    if cuda:
        step_times = [marks[i].elapsed_time(marks[i + 1]) / 1000 for i in range(len(marks) - 1)]
    else:
        step_times = [marks[i + 1] - marks[i] for i in range(len(marks) - 1)]
    step_times.sort()
    median_step = statistics.median(step_times)
    final_loss = float(loss)
    place = placement()  # after the timed parts: reading numa_maps takes a while
    dist.destroy_process_group()
    result = {
        "t_main": T_MAIN, "t_imported": T_IMPORTED, "t_device": t_device, "t_init": t_init, "t_model": t_model, "t_ready": t_ready, "t_step1": t_step1,
        "t_steady": [t0, t1],
        "usage": {k: usage(u) for k, u in (("main", U_MAIN), ("imported", U_IMPORTED), ("device", u_device),
                                            ("init", u_init), ("model", u_model), ("ready", u_ready),
                                            ("step1", u_step1))},
        "placement": place,
        "steady_step_s": steady, "chunk_step_s": chunks, "median_step_s": median_step,
        "step_s_quartiles": [step_times[len(step_times) // 4], step_times[(3 * len(step_times)) // 4]], "steps": per_chunk * a.chunks, "warmup": a.warmup,
        "loss": final_loss, "model": desc, "params": sum(p.numel() for p in model.parameters()),
        "dtype": a.dtype, "cudnn_benchmark": a.cudnn_benchmark, "backend": backend, "torch": torch.__version__, "pid": os.getpid(),
        "device": torch.cuda.get_device_name(device) if a.device == "cuda" else "cpu",
        "affinity": sorted(os.sched_getaffinity(0)), "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "env": ENV0,
    }
    tmp = a.out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.rename(tmp, a.out)


if __name__ == "__main__":
    main()
