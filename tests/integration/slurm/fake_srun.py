#!/usr/bin/python3
"""A stand-in for SLURM's srun, put first on PATH by test_slurm.py, kept only for what the real
srun of test_slurm_real.py cannot show there: a node whose task fails at once, before its agent
runs (FAKE_SRUN_FAIL_NODE). The real cluster's nodes share one file system and one ddp-agentd,
so no real node can lack or break the agent while the others have it. Everything else of
`ddpctl launch --slurm` (srun's flags, the secret, failures, scancel, signals, TLS, time limit)
is tested against the real srun.

It does what `ddpctl launch --slurm` needs of srun's step launch, on simulated hosts:
  - runs the command once per node of --nodelist (SLURM syntax, one bracket per name is enough
    here) inside that node's namespaces, using the prefixes in FAKE_SRUN_HOSTS (JSON: node ->
    argv prefix), with srun's own environment (--export=ALL);
  - relays every task's stdout and stderr with srun's --label prefix ("3: ");
  - on SIGTERM or SIGINT passes SIGTERM to every task, as srun does, and with
    --kill-on-bad-exit=1 when a task fails; exits with the highest task status once every task
    has ended.
FAKE_SRUN_FAIL_NODE=n2 makes that node's task fail at once (without running the command).
"""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

def expand(nodelist):
    out = []
    for item in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,]*", nodelist):
        m = re.match(r"^(.*)\[([^\]]*)\](.*)$", item)
        if not m:
            out.append(item)
            continue
        for part in m[2].split(","):
            lo, _, hi = part.partition("-")
            for i in range(int(lo), int(hi or lo) + 1):
                out.append(f"{m[1]}{str(i).zfill(len(lo))}{m[3]}")
    return out


def main():
    args = sys.argv[1:]
    opts, i = {}, 0
    while i < len(args) and args[i].startswith("-"):
        k, _, v = args[i].partition("=")
        opts[k] = v
        i += 1
    command = args[i:]
    prefixes = json.load(open(os.environ["FAKE_SRUN_HOSTS"]))
    nodes = expand(opts["--nodelist"])
    assert len(nodes) == int(opts["--nodes"]) == int(opts["--ntasks"]), opts
    lock = threading.Lock()
    tasks = []

    def relay(task, stream, out):
        for line in iter(stream.readline, b""):
            with lock:
                out.buffer.write(f"{task}: ".encode() + line)
                out.flush()

    for task, node in enumerate(nodes):
        if node == os.environ.get("FAKE_SRUN_FAIL_NODE"):
            print(f"{task}: fake failure of the task on {node}", file=sys.stderr, flush=True)
            print(f"srun: error: {node}: task {task}: Exited with exit code 3", file=sys.stderr, flush=True)
            continue
        p = subprocess.Popen(prefixes[node] + command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)
        tasks.append(p)
        for stream, out in ((p.stdout, sys.stdout), (p.stderr, sys.stderr)):
            threading.Thread(target=relay, args=(task, stream, out), daemon=True).start()

    def forward(sig, frame):
        for p in tasks:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    worst = 3 if os.environ.get("FAKE_SRUN_FAIL_NODE") in nodes else 0
    kill_on_bad_exit = opts.get("--kill-on-bad-exit") == "1"
    killed = False
    running = list(tasks)
    while running:
        if worst and kill_on_bad_exit and not killed:
            print("srun: error: a task failed: terminating the step (--kill-on-bad-exit)", file=sys.stderr, flush=True)
            forward(None, None)
            killed = True
        for p in list(running):
            rc = p.poll()
            if rc is not None:
                running.remove(p)
                worst = max(worst, rc if rc >= 0 else 128 - rc)
        time.sleep(0.05)
    return worst


if __name__ == "__main__":
    sys.exit(main())
