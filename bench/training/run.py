#!/usr/bin/env python3
"""ddpctl's own overhead on a training job: the same script (bench/training/step.py, DDP, one
rank) started by hand and through ddpctl, alternately in one invocation, in pairs whose order
alternates (hand then ddpctl, ddpctl then hand, ...: a run slowed by the one before it, or by the
GPU's clocks as they settle, weighs on both sides alike), reported as medians, their ratio and
the noise band of the hand runs; the order effect (second run of a pair over the first) is
printed beside it. The number of pairs is even, so that both orders weigh alike. On a GPU each
run also records the GPU's SM clock, temperature and power over its steady window (nvidia-smi
in the background), so a run that stepped slower than the others shows whether the GPU ran
slower in it.

Two numbers per run, both from step.py's CLOCK_MONOTONIC timestamps (one clock for every process
of the machine):
  first step   from the instant this harness asks for the process (time.monotonic() right
               before Popen: of `python3 -u step.py` by hand, of `ddpctl torchrun ... step.py`
               through ddpctl) to the end of step 1 (forward, backward, optimizer step, device
               synchronised). The same reference point for both sides: everything ddpctl does
               before the rank's Python starts (parsing, planning, the store, the fork) counts
               against it.
  steady step  the median of the --steps step times after step 1 and --warmup more (each
               step timed on the GPU by CUDA events, no synchronisation added): the run's
               typical step. The mean over the same window (timed between two device
               synchronisations) is reported beside it; on a shared machine a few disturbed
               steps move a run's mean by 10% and more, in either launcher's runs.

"The same environment": a first ddpctl run (not counted) records the environment its rank got;
the hand runs get exactly that (ddpctl's variables included: CUDA_VISIBLE_DEVICES, NCCL_*,
the flight recorder's TORCH_*, with paths into ddpctl's log folder moved to a folder of each
hand run's own) except two, which must differ: MASTER_PORT (a free port of its own) and
TORCHELASTIC_USE_AGENT_STORE (removed: started by hand, rank 0 hosts the TCPStore inside its
own process, which is what `python3 train.py` with env:// does; through ddpctl it is a client
of ddpctl's store). One hand run is also made first and not counted (page cache, GPU clocks).

Each run also reports, from step.py, its CPU time (user and system, all threads), page faults
and context switches by phase (getrusage at each phase's end) and where it ran (allowed CPUs and
memory nodes, its mappings' memory policies, its cgroup); a table of the phases' CPU time by
side follows the timings. A slower run that spent more CPU on the same work, with the same
faults, ran on slower CPUs; one that spent the same CPU waited. ddpctl places its rank (CPUs,
and a memory policy preferring its GPU's NUMA node, even on a one-node machine); a hand run
keeps the default unless --hand-prefix starts it under a command that places it alike, e.g.
--hand-prefix "numactl --preferred=0". --control makes the sitting an A/A control: a second hand
run takes ddpctl's place in every pair, so the gap two identical sides show in that sitting
(on a freshly started machine, a second and more with four pairs) can be set beside a real one.

The model: by default a stack of transformer blocks (step.py's own, 168 M parameters, bf16),
whose step is the GPU's work: on the H100 its runs' median steps agreed within 0.34%. ResNet-50
(--model resnet50) at batch 128 on one GPU waits on the host: its SM clock held at its maximum
in every run while the runs' steps spread 20% and the GPU's power fell as they slowed, so on a
shared machine it measures the host's load between runs, not the launcher.

Targets (issue 27): steady step within 1% and the first step within 0.3 s (median ddpctl -
median hand <= 0.3 s). The steady step is judged pair by pair: each pair's ratio ddpctl/hand
(the two runs back to back, so a drift of the GPU's clocks over the sitting cancels), their
median against 1.01, and a 95% bootstrap interval of that median says whether the sitting
resolves 1% at all (its upper end within 1.01: resolved). The same for the runs' mean steps, the
ratio of the medians and the noise band (the hand runs' spread over their median) are printed
beside it. Output: a table on
stdout and one JSON (--json). Exit 0 when both targets are met, 1 when not, 2 on an error.

  bench/training/run.py --ddpctl build/bin/ddpctl --python /opt/torch/.venv/bin/python   # the H200
  bench/training/run.py --device cpu --model tiny --pairs 2 --steps 5 --warmup 1          # smoke test
"""
import argparse
import json
import os
import random
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STEP = Path(__file__).resolve().parent / "step.py"
MUST_DIFFER = ("MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GpuSampler:
    """The GPU's SM clock, temperature and power while a run goes on: `nvidia-smi -lms` in the
    background (the rank is not touched), each line stamped with time.monotonic() as it arrives,
    so that the samples inside the run's steady window can be told apart. Whole runs that step
    slower than the others show whether the GPU was clocked lower in them. Nothing (None) where
    nvidia-smi is missing or says nothing parseable."""

    def __init__(self, gpu, interval_ms=200):
        self.samples = []  # (monotonic, sm_mhz, temperature_c, power_w)
        self.proc = None
        exe = shutil.which("nvidia-smi")
        if not exe:
            return
        self.proc = subprocess.Popen(
            [exe, "-i", gpu, "--query-gpu=clocks.sm,temperature.gpu,power.draw", "--format=csv,noheader,nounits",
             "-lms", str(interval_ms)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        def num(v):
            try:
                return float(v)
            except ValueError:
                return None  # "[N/A]": a GPU that does not report it

        for line in self.proc.stdout:
            now = time.monotonic()
            fields = [num(v) for v in line.split(",")]
            if len(fields) == 3 and fields[0] is not None:  # else a message, or no clock
                self.samples.append((now, *fields))

    def stop(self):
        if self.proc:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.reader.join(timeout=5)

    def window(self, t0, t1):
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        if not inside:
            return None
        sm = [s[1] for s in inside]
        temps = [s[2] for s in inside if s[2] is not None]
        powers = [s[3] for s in inside if s[3] is not None]
        return {"samples": len(inside), "sm_mhz_median": statistics.median(sm), "sm_mhz_min": min(sm),
                "temperature_c_max": max(temps) if temps else None,
                "power_w_median": statistics.median(powers) if powers else None}


def gpu_of(env):
    """The GPU a one-rank run uses: the first entry of CUDA_VISIBLE_DEVICES (an index or a UUID,
    both of which nvidia-smi -i takes), else 0."""
    first = env.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return first or "0"


def machine_load():
    """What else the machine was doing: the 1-minute load average and the kernel's pressure
    figures (the share of the last 10 s some task waited for a CPU, for I/O, for memory). A
    freshly started machine may still be busy with its own start; a run slowed by that shows it
    here. None for what this kernel does not report."""
    def read(path):
        try:
            return Path(path).read_text()
        except OSError:
            return None

    out = {"loadavg_1m": None}
    la = read("/proc/loadavg")
    if la:
        out["loadavg_1m"] = float(la.split()[0])
    for res in ("cpu", "io", "memory"):
        text = read(f"/proc/pressure/{res}")
        some = text.splitlines()[0].split() if text else []
        out[f"{res}_some_avg10"] = float(some[1].split("=")[1]) if len(some) > 1 and "=" in some[1] else None
    return out


def one_run(side, argv, env, work, idx, timeout, out_json, sample_gpu=False):
    log = work / f"{idx:02d}-{side}.log"
    load_before = machine_load()
    sampler = GpuSampler(gpu_of(env)) if sample_gpu else None
    try:
        with open(log, "w") as f:
            t_req = time.monotonic()
            p = subprocess.Popen(argv, env=env, cwd=work, stdout=f, stderr=subprocess.STDOUT)
            try:
                rc = p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                raise SystemExit(f"run.py: {side} run {idx} took more than {timeout} s; its output: {log}")
            t_exit = time.monotonic()
    finally:
        if sampler:
            sampler.stop()
    if rc != 0 or not Path(out_json).exists():
        tail = log.read_text()[-3000:]
        raise SystemExit(f"run.py: {side} run {idx} failed (exit {rc}): {' '.join(argv)}\n--- {log}:\n{tail}")
    r = json.loads(Path(out_json).read_text())
    return {
        "side": side, "index": idx,
        "first_step_s": r["t_step1"] - t_req,
        "python_start_s": r["t_main"] - t_req,   # the request to the script's first line
        "import_s": r["t_imported"] - r["t_main"],
        "device_s": r["t_device"] - r["t_imported"],  # set_device: on a GPU, the CUDA context
        "init_s": r["t_init"] - r["t_device"],        # init_process_group
        "model_s": r["t_model"] - r["t_init"],        # model and data built on the device
        "ddp_s": r["t_ready"] - r["t_model"],         # the DDP wrapper (NCCL's communicator), optimizer
        "step1_s": r["t_step1"] - r["t_ready"],
        "load": {"before": load_before, "after": machine_load()},
        "steady_step_s": r["median_step_s"], "mean_step_s": r["steady_step_s"], "chunk_step_s": r["chunk_step_s"],
        "step_s_quartiles": r["step_s_quartiles"],
        "total_s": t_exit - t_req,
        "rank": {k: r[k] for k in ("model", "params", "dtype", "cudnn_benchmark", "backend", "torch", "device",
                                    "affinity", "loss", "steps", "warmup")},
        "env": r["env"],
        # To the end of step 1, from the script's first line: CPU time, faults, switches (getrusage).
        "usage_to_step1": {k: r["usage"]["step1"][k] - r["usage"]["main"][k] for k in r["usage"]["main"]}
        if "usage" in r else None,
        "usage_by_phase": {ph: {k: r["usage"][ph][k] - r["usage"][prev][k] for k in r["usage"][ph]}
                           for prev, ph in zip(("main", "imported", "device", "init", "model", "ready"),
                                               ("imported", "device", "init", "model", "ready", "step1"))}
        if "usage" in r else None,
        "placement": r.get("placement"),
        "gpu": sampler.window(*r["t_steady"]) if sampler and "t_steady" in r else None,
    }


def spread(xs):
    return (max(xs) - min(xs)) if xs else 0.0


def bootstrap_median_ci(xs, resamples=10000, seed=27):
    """95% percentile-bootstrap interval of the median of xs (a fixed seed: the same runs give the
    same interval)."""
    rng = random.Random(seed)
    k = len(xs)
    meds = sorted(statistics.median(rng.choices(xs, k=k)) for _ in range(resamples))
    return meds[int(0.025 * resamples)], meds[int(0.975 * resamples) - 1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ddpctl", default=str(ROOT / "build" / "bin" / "ddpctl"))
    ap.add_argument("--python", default=sys.executable, help="the interpreter with torch (both sides)")
    ap.add_argument("--launcher", default="torchrun", choices=["torchrun", "launch"],
                    help="ddpctl torchrun --standalone --nproc-per-node 1 SCRIPT, or ddpctl launch -n 1 -- PY -u SCRIPT")
    ap.add_argument("--pairs", type=int, default=6,
                    help="counted (hand, ddpctl) pairs; an odd number is rounded up (half of them run hand first)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--model", default="transformer", choices=["auto", "resnet50", "transformer", "tiny"],
                    help="transformer (default): GPU-bound, so its step time is the GPU's; resnet50 (auto with "
                         "torchvision): at batch 128 on one GPU its step waits on the host (most likely its "
                         "kernel launches), and on a shared VM the host's speed moves it between runs by 10-20%%")
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--cudnn-benchmark", action="store_true",
                    help="step.py lets cuDNN time its algorithms in each run (default: its heuristics, the same "
                         "choice every run; timed, the choice and the step time can differ between runs)")
    ap.add_argument("--timeout", type=float, default=180, help="seconds for one run")
    ap.add_argument("--budget", type=float, default=0,
                    help="seconds: start no two more pairs when twice the last pair's time would overrun this "
                         "(at least 2 pairs)")
    ap.add_argument("--hand-prefix", default="",
                    help="a command the hand runs start under (split as a shell would), e.g. to place them as "
                         "ddpctl places its rank: 'numactl --preferred=0 taskset -c 0-15'")
    ap.add_argument("--control", action="store_true",
                    help="an A/A control: the second side of each pair is a hand run too (in ddpctl's place in "
                         "the order, and in its columns), so the sitting's own noise between two identical sides "
                         "shows; the first, uncounted ddpctl run still records the environment")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (logs)")
    ap.add_argument("--report-only", action="store_true", help="exit 0 whatever the verdict (a smoke test)")
    a = ap.parse_args()
    a.pairs += a.pairs % 2
    if not os.access(a.ddpctl, os.X_OK):
        raise SystemExit(f"run.py: {a.ddpctl} is not an executable ddpctl (build it, or give --ddpctl)")

    work = Path(tempfile.mkdtemp(prefix="ddp-train-bench-"))
    script_args = ["--device", a.device, "--model", a.model, "--batch", str(a.batch), "--dtype", a.dtype,
                   "--steps", str(a.steps), "--warmup", str(a.warmup)] + (["--cudnn-benchmark"] * a.cudnn_benchmark)
    base = dict(os.environ)
    base.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    idx = 0

    def ddpctl_run():
        nonlocal idx
        idx += 1
        out = str(work / f"{idx:02d}-ddpctl.json")
        if a.launcher == "torchrun":
            argv = [a.ddpctl, "torchrun", "--standalone", "--nproc-per-node", "1", "--log-dir", str(work / "logs"),
                    str(STEP), "--out", out, *script_args]
        else:
            argv = [a.ddpctl, "launch", "-n", "1", "--log-dir", str(work / "logs"), "--", a.python, "-u", str(STEP),
                    "--out", out, *script_args]
        return one_run("ddpctl", argv, {**base, "PYTHON_EXEC": a.python}, work, idx, a.timeout, out, a.device == "cuda")

    def hand_run(env, side="hand"):
        nonlocal idx
        idx += 1
        out = str(work / f"{idx:02d}-{side}.json")
        # Paths into the first ddpctl run's log folder (the error file, the flight recorder's
        # dump and pipe files): the same paths in a folder of this run's own.
        own = work / f"hand-{idx:02d}"
        env = {k: v.replace(str(work / "logs"), str(own)) for k, v in env.items()}
        for k, v in env.items():
            if str(own) in v:
                Path(v).parent.mkdir(parents=True, exist_ok=True)
        env["MASTER_PORT"] = str(free_port())
        argv = [*shlex.split(a.hand_prefix), a.python, "-u", str(STEP), "--out", out, *script_args]
        return one_run(side, argv, env, work, idx, a.timeout, out, a.device == "cuda")

    print(f"training overhead: {a.pairs} pairs (hand, ddpctl), {a.device}, model {a.model}, {a.dtype}; work {work}",
          flush=True)
    begun = time.monotonic()  # --budget counts from here, the runs not counted included
    first = ddpctl_run()  # not counted: it records the rank's environment
    launcher_set = {k: v for k, v in first["env"].items() if base.get(k) != v and k != "PYTHON_EXEC"}
    hand_env = {**base, **{k: v for k, v in launcher_set.items() if k not in MUST_DIFFER}}
    hand_run(hand_env)  # not counted either
    print("  copied from ddpctl's rank to the hand runs: " + " ".join(sorted(k for k in launcher_set if k not in
                                                                              MUST_DIFFER)), flush=True)
    runs, last_pair = [], 0.0
    for i in range(a.pairs):
        pair_start = time.monotonic()
        # Stops only after an even number of pairs: as many hand-first as ddpctl-first, so that
        # an order effect cancels in the median instead of deciding it.
        if a.budget and i >= 2 and i % 2 == 0 and (pair_start - begun) + 2 * last_pair > a.budget:
            print(f"  stopping after {i} pairs: two more would overrun --budget {a.budget:.0f} s", flush=True)
            break
        # Even pairs hand first, odd pairs ddpctl first; runs keeps (hand, ddpctl) per pair.
        order = ("hand", "ddpctl") if i % 2 == 0 else ("ddpctl", "hand")
        done = {}
        for side in order:
            if side == "hand":
                r = hand_run(hand_env)
            else:  # ddpctl's turn; with --control a second hand run takes it
                r = hand_run(hand_env, side="ddpctl") if a.control else ddpctl_run()
            r["first_in_pair"] = side == order[0]
            done[side] = r
            ld = r["load"]["before"]
            shown = "hand2" if a.control and r["side"] == "ddpctl" else r["side"]
            print(f"  {shown:6s} first step {r['first_step_s']:7.3f} s (python up {r['python_start_s']:.3f}, "
                  f"import {r['import_s']:.3f}, device {r['device_s']:.3f}, init {r['init_s']:.3f}, "
                  f"model {r['model_s']:.3f}, ddp {r['ddp_s']:.3f}, step 1 {r['step1_s']:.3f})  "
                  f"steady {r['steady_step_s'] * 1000:8.3f} ms  total {r['total_s']:.2f} s  "
                  f"load {ld['loadavg_1m']}, cpu/io pressure {ld['cpu_some_avg10']}/{ld['io_some_avg10']}%"
                  + (f"  GPU {r['gpu']['sm_mhz_median']:.0f} MHz (min {r['gpu']['sm_mhz_min']:.0f}), "
                     f"{r['gpu']['temperature_c_max']} C, {r['gpu']['power_w_median']} W" if r["gpu"] else ""),
                  flush=True)
            if r["usage_to_step1"]:
                u = r["usage_to_step1"]
                print(f"         to step 1: CPU user {u['user_s']:.2f} s, system {u['sys_s']:.2f} s; page faults "
                      f"{u['minflt']} minor, {u['majflt']} major; switches {u['nvcsw']} voluntary, "
                      f"{u['nivcsw']} involuntary", flush=True)
        runs += [done["hand"], done["ddpctl"]]
        last_pair = time.monotonic() - pair_start
    pairs = len(runs) // 2

    def col(side, key):
        return [r[key] for r in runs if r["side"] == side]

    summary = {}
    for key in ("first_step_s", "python_start_s", "import_s", "device_s", "init_s", "model_s", "ddp_s", "step1_s",
                "steady_step_s", "mean_step_s", "total_s"):
        h, d = col("hand", key), col("ddpctl", key)
        summary[key] = {"hand_median": statistics.median(h), "ddpctl_median": statistics.median(d),
                        "hand_spread": spread(h), "ddpctl_spread": spread(d),
                        "delta": statistics.median(d) - statistics.median(h)}
    st = summary["steady_step_s"]
    ratio = st["ddpctl_median"] / st["hand_median"]
    band = st["hand_spread"] / st["hand_median"]
    # pair i is runs[2i] (hand), runs[2i+1] (ddpctl), whichever ran first
    pair_ratios = [runs[2 * i + 1]["steady_step_s"] / runs[2 * i]["steady_step_s"] for i in range(pairs)]
    # The order effect: each pair's second run over its first, whichever launcher it was.
    order_ratios = [(runs[2 * i]["steady_step_s"] / runs[2 * i + 1]["steady_step_s"])
                    ** (1 if runs[2 * i + 1]["first_in_pair"] else -1) for i in range(pairs)]
    pair_median = statistics.median(pair_ratios)
    ci_lo, ci_hi = bootstrap_median_ci(pair_ratios)
    resolved = ci_hi <= 1.01
    mean_ratios = [runs[2 * i + 1]["mean_step_s"] / runs[2 * i]["mean_step_s"] for i in range(pairs)]
    mean_ci = bootstrap_median_ci(mean_ratios)
    mst = summary["mean_step_s"]
    mean_band = mst["hand_spread"] / mst["hand_median"]
    fs = summary["first_step_s"]
    steady_ok = pair_median <= 1.01
    first_ok = fs["delta"] <= 0.3
    rank = runs[0]["rank"]
    result = {
        "benchmark": "training-overhead", "pairs": pairs, "launcher": a.launcher,
        "ddpctl": a.ddpctl, "python": a.python, "host": socket.gethostname(), "cores": os.cpu_count(),
        "model": rank["model"], "params": rank["params"], "dtype": rank["dtype"],
        "cudnn_benchmark": rank["cudnn_benchmark"], "backend": rank["backend"],
        "torch": rank["torch"], "device": rank["device"], "steps": rank["steps"], "warmup": rank["warmup"],
        "affinity_hand": runs[0]["rank"]["affinity"] == runs[1]["rank"]["affinity"] and "same as ddpctl's" or
        {"hand": runs[0]["rank"]["affinity"], "ddpctl": runs[1]["rank"]["affinity"]},
        "copied_env": sorted(k for k in launcher_set if k not in MUST_DIFFER), "must_differ": list(MUST_DIFFER),
        "summary": summary,
        "steady_ratio": ratio, "steady_noise_band": band, "first_step_delta_s": fs["delta"],
        "steady_pair_ratios": pair_ratios, "steady_pair_median": pair_median,
        "steady_pair_median_ci95": [ci_lo, ci_hi], "steady_resolved_to_1pct": resolved,
        "steady_order_ratios_second_over_first": order_ratios,
        "mean_step_pair_ratios": mean_ratios, "mean_step_pair_median": statistics.median(mean_ratios),
        "mean_step_pair_median_ci95": list(mean_ci), "mean_step_noise_band": mean_band,
        "targets": {"steady_ratio_max": 1.01, "first_step_delta_max_s": 0.3},
        "pass": None if a.control else {"steady": steady_ok, "first_step": first_ok},
        "hand_prefix": a.hand_prefix, "control": a.control,
        "runs": [{k: v for k, v in r.items() if k not in ("env", "rank")} for r in runs],
    }
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=2) + "\n")

    other = "hand again (A/A control)" if a.control else f"ddpctl {a.launcher}"
    print()
    if a.control:
        print("A/A CONTROL: the ddpctl column below is a second hand run, in ddpctl's place in each pair")
    print(f"{rank['model']}; {rank['params'] / 1e6:.1f} M parameters; {rank['dtype']}"
          f"{', cuDNN timed' if rank['cudnn_benchmark'] else ''}, {rank['backend']}, "
          f"torch {rank['torch']}, {rank['device']}; {rank['steps']} steady steps after {rank['warmup']} + 1")
    print(f"| measure (median of {pairs}) | by hand | {other} | ddpctl - hand | hand spread |")
    print("|---|---|---|---|---|")
    for key, label in (("first_step_s", "request to end of step 1"), ("python_start_s", "request to script's line 1"),
                       ("import_s", "import torch"), ("device_s", "set_device (CUDA context)"),
                       ("init_s", "init_process_group"), ("model_s", "model built"),
                       ("ddp_s", "DDP wrapper (NCCL communicator)"), ("step1_s", "step 1 itself"),
                       ("total_s", "request to process exit")):
        s = summary[key]
        print(f"| {label} | {s['hand_median']:.3f} s | {s['ddpctl_median']:.3f} s | {s['delta']:+.3f} s | "
              f"{s['hand_spread']:.3f} s |")
    for s, label in ((st, "steady step (each run's median step)"), (mst, "each run's mean step")):
        print(f"| {label} | {s['hand_median'] * 1000:.3f} ms | {s['ddpctl_median'] * 1000:.3f} ms | "
              f"{(s['ddpctl_median'] - s['hand_median']) * 1000:+.3f} ms | {s['hand_spread'] * 1000:.3f} ms |")
    if all(r["usage_by_phase"] for r in runs):
        print()
        print(f"| CPU time, user + system (median of {pairs}) | by hand | {other} | ddpctl - hand |")
        print("|---|---|---|---|")
        for ph, label in (("imported", "import torch"), ("device", "set_device"), ("init", "init_process_group"),
                          ("model", "model built"), ("ready", "DDP wrapper"), ("step1", "step 1 itself")):
            h = statistics.median(r["usage_by_phase"][ph]["user_s"] + r["usage_by_phase"][ph]["sys_s"]
                                  for r in runs if r["side"] == "hand")
            d = statistics.median(r["usage_by_phase"][ph]["user_s"] + r["usage_by_phase"][ph]["sys_s"]
                                  for r in runs if r["side"] == "ddpctl")
            print(f"| {label} | {h:.3f} s | {d:.3f} s | {d - h:+.3f} s |")
        for key, label in (("sys_s", "system time to step 1"), ("minflt", "minor faults to step 1"),
                           ("majflt", "major faults to step 1"), ("nivcsw", "involuntary switches to step 1")):
            h = statistics.median(r["usage_to_step1"][key] for r in runs if r["side"] == "hand")
            d = statistics.median(r["usage_to_step1"][key] for r in runs if r["side"] == "ddpctl")
            print(f"| {label} | {h:.3f} | {d:.3f} | {d - h:+.3f} |" if key == "sys_s" else
                  f"| {label} | {h:.0f} | {d:.0f} | {d - h:+.0f} |")
    for side in ("hand", "ddpctl"):
        pl = next((r["placement"] for r in runs if r["side"] == side and r["placement"]), None)
        if pl:
            print(f"placement, {side if side == 'hand' else other}: CPUs {pl.get('Cpus_allowed_list')}, "
                  f"memory nodes {pl.get('Mems_allowed_list')}, policies {','.join(pl.get('numa_policies') or ['?'])}, THP {pl.get('anon_huge_kb')} kB, "
                  f"cgroup {pl.get('cgroup')}")
    print()
    print("median step per pair, ddpctl/hand: " + " ".join(f"{r:.4f}" for r in pair_ratios))
    print("mean step per pair, ddpctl/hand:   " + " ".join(f"{r:.4f}" for r in mean_ratios))
    print("pairs' order: " + " ".join("hand first" if runs[2 * i]["first_in_pair"] else "ddpctl first"
                                      for i in range(pairs)))
    print(f"order effect (median step, second run of a pair over its first): median "
          f"{statistics.median(order_ratios):.4f}; " + " ".join(f"{r:.4f}" for r in order_ratios))
    print(f"mean step: median of the pair ratios {statistics.median(mean_ratios):.4f}, 95% interval "
          f"[{mean_ci[0]:.4f}, {mean_ci[1]:.4f}], noise band of the hand runs {mean_band * 100:.2f}%")
    if a.control:  # no launcher was measured: the same figures, not a verdict
        print(f"CONTROL (A/A, no verdict): steady step, median of {pairs} pair ratios, the hand run in ddpctl's "
              f"slot over the hand slot's, {pair_median:.4f}, 95% interval [{ci_lo:.4f}, {ci_hi:.4f}]; first step, "
              f"ddpctl's slot - the hand slot {fs['delta']:+.3f} s, spread of the hand slot {fs['hand_spread']:.3f} s")
        if not a.keep:
            subprocess.run(["rm", "-rf", str(work)])
        return 0
    print(f"TRAINING steady step: median of {pairs} pair ratios ddpctl/hand {pair_median:.4f} (target <= 1.01), "
          f"95% interval [{ci_lo:.4f}, {ci_hi:.4f}]; ratio of the medians {ratio:.4f}; noise band of the hand runs "
          f"{band * 100:.2f}%: {'PASS' if steady_ok else 'FAIL'}"
          + (", resolved (the interval ends within 1%)" if resolved
             else f", not resolved to 1% (the interval reaches {ci_hi:.4f})"))
    print(f"TRAINING first step: ddpctl - hand {fs['delta']:+.3f} s (target <= 0.3 s), hand spread "
          f"{fs['hand_spread']:.3f} s: {'PASS' if first_ok else 'FAIL'}")
    if not a.keep:
        subprocess.run(["rm", "-rf", str(work)])
    return 0 if a.report_only or (steady_ok and first_ok) else 1


if __name__ == "__main__":
    sys.exit(main())
