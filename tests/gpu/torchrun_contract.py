#!/usr/bin/env python3
"""The same script and flags under this machine's torchrun and under `ddpctl torchrun`: each
rank's environment contract compared, variable by variable (issue 25's proof; the H200 has
PyTorch 2.11, CI's tests/integration/launch/test_torchrun.py does the same against Debian's 1.13).

  tests/gpu/torchrun_contract.py DDPCTL PYTHON [--nproc 1,2] [--json FILE]

Both launchers get the same environment E (PYTHON_EXEC=PYTHON, which both honour, so both run
the same interpreter), the same working folder and `--standalone --nproc-per-node N script.py
--arg x`. Each rank records os.environ as its first act (before torch is imported), argv,
sys.executable, its folder, then a gloo all_reduce. A variable is in the contract when a
launcher set or changed it (its value in the rank differs from E) or removed it. Per variable:
  PASS   both launchers set it to the same value
  PASS   both set it, to values that differ by design (DIFFER below, with the reason)
  FAIL   both set it, to different values not named in DIFFER
  FAIL   torchrun sets it and ddpctl does not (a script reading it would break)
  NOTE   ddpctl sets it and torchrun does not (listed; ddpctl's own DDP_* and interface choices)
Then argv, sys.orig_argv, sys.executable, the folder and the all_reduce sum must be equal.
Last line: "TORCHRUN_CONTRACT PASS ..." or "TORCHRUN_CONTRACT FAIL ..."; exit 0 / 1.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# Values that differ by design; equal values pass too (e.g. 2.x's torchrun also says "True").
DIFFER = {
    "MASTER_ADDR": "torchrun: its host name or rendezvous host; ddpctl: 127.0.0.1, where its store listens",
    "MASTER_PORT": "each launcher picks a free port",
    "TORCHELASTIC_RUN_ID": "torchrun: a uuid (--standalone); ddpctl: the job id",
    "TORCHELASTIC_ERROR_FILE": "each launcher's own log folder",
    "TORCHELASTIC_USE_AGENT_STORE": "ddpctl serves the store (True); torchrun 1.13's c10d has rank 0 host it",
}

SCRIPT = r"""
import os, sys
env0 = dict(os.environ)  # before anything is imported that could add to it
import json
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(t)
out = {"env": env0, "sum": t.item(), "argv": sys.argv, "orig_argv": getattr(sys, "orig_argv", [])[1:],
       "executable": sys.executable, "cwd": os.getcwd(), "torch": torch.__version__}
tag = os.environ["TAG"]
with open(f"{tag}rank-{dist.get_rank()}.json.tmp", "w") as f:
    json.dump(out, f)
os.rename(f"{tag}rank-{dist.get_rank()}.json.tmp", f"{tag}rank-{dist.get_rank()}.json")
dist.destroy_process_group()
"""

# Debian's torchrun 1.13 on Python 3.11 fails before any worker starts (3.11's IntFlag: Std.from_str
# gives None); the same torchrun with that one function mended. Used only for torch 1.x.
MENDED = """import sys
from torch.distributed.elastic.multiprocessing import api
def from_str(cls, vm):
    if ':' not in vm: return cls(int(vm))
    return {int(i): cls(int(v)) for i, v in (m.split(':') for m in vm.split(','))}
api.Std.from_str = classmethod(from_str)
from torch.distributed.run import main
sys.exit(main())
"""


def launch(name, argv, work, env, timeout):
    r = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        print(f"FAIL  {name} exited {r.returncode}: {' '.join(argv)}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
    return r.returncode == 0


def compare(t, d, base):
    """Returns (lines, failures) for one rank: t from torchrun, d from ddpctl."""
    lines, fails = [], 0

    def contract(env):
        c = {k: v for k, v in env.items() if base.get(k) != v}
        c.update({k: None for k in base if k not in env})  # removed by the launcher
        return c

    tc, dc = contract(t["env"]), contract(d["env"])
    for k in sorted(set(tc) | set(dc)):
        tv, dv = tc.get(k, base.get(k)), dc.get(k, base.get(k))
        if k in tc and k in dc:
            if tv == dv:
                lines.append(f"PASS  {k}={tv}")
            elif k in DIFFER:
                lines.append(f"PASS  {k} differs by design: torchrun {tv!r}, ddpctl {dv!r} ({DIFFER[k]})")
            else:
                lines.append(f"FAIL  {k}: torchrun {tv!r}, ddpctl {dv!r}")
                fails += 1
        elif k in tc:
            if k in DIFFER:
                lines.append(f"PASS  {k}: torchrun {tv!r}, ddpctl leaves it {dv!r} ({DIFFER[k]})")
            else:
                lines.append(f"FAIL  {k}: torchrun sets {tv!r}, ddpctl leaves it {dv!r}")
                fails += 1
        else:
            shown = dv if dv is None or len(dv) <= 72 else dv[:40] + f"... ({len(dv)} characters)"
            lines.append(f"NOTE  {k}: ddpctl sets {shown!r}, torchrun leaves it {tv!r}")
    for k in ("argv", "orig_argv", "executable", "cwd", "sum"):
        if t[k] == d[k]:
            lines.append(f"PASS  {k}: {t[k]!r}")
        else:
            lines.append(f"FAIL  {k}: torchrun {t[k]!r}, ddpctl {d[k]!r}")
            fails += 1
    return lines, fails


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ddpctl")
    ap.add_argument("python")
    ap.add_argument("--nproc", default="1,2", help="process counts to compare, one launch pair each")
    ap.add_argument("--timeout", type=float, default=180)
    ap.add_argument("--json", help="write every rank's comparison here")
    a = ap.parse_args()
    torch_version = subprocess.run([a.python, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                                   text=True, check=True).stdout.strip()
    work = Path(tempfile.mkdtemp(prefix="ddp-torchrun-contract-"))
    (work / "script.py").write_text(SCRIPT)
    if torch_version.startswith("1."):
        (work / "torchrun_mended.py").write_text(MENDED)
        torchrun = [a.python, str(work / "torchrun_mended.py")]
    else:
        torchrun = [a.python, "-m", "torch.distributed.run"]
    base = dict(os.environ)
    for k in list(base):  # nothing of an enclosing launch leaks into the comparison
        if k in DIFFER or k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE") or k.startswith(
                ("TORCHELASTIC_", "GROUP_", "ROLE_")):
            del base[k]
    base["PYTHON_EXEC"] = a.python
    total_fail, report = 0, {"torch": torch_version, "python": a.python, "runs": []}
    print(f"torch {torch_version} ({a.python}); torchrun: {' '.join(torchrun)}; ddpctl: {a.ddpctl}")
    for n in [int(x) for x in a.nproc.split(",")]:
        nproc_flag = "--nproc_per_node" if torch_version.startswith("1.") else "--nproc-per-node"
        flags = ["--standalone", nproc_flag, str(n), "script.py", "--arg", "x"]
        print(f"\n=== {n} process(es): torchrun {' '.join(flags)}  vs  ddpctl torchrun {' '.join(flags)}")
        ok_t = launch("torchrun", [*torchrun, *flags], work, {**base, "TAG": f"t{n}-"}, a.timeout)
        ok_d = launch("ddpctl torchrun", [a.ddpctl, "torchrun", *flags], work, {**base, "TAG": f"d{n}-"}, a.timeout)
        if not (ok_t and ok_d):
            total_fail += 1
            continue
        for rank in range(n):
            t = json.loads((work / f"t{n}-rank-{rank}.json").read_text())
            d = json.loads((work / f"d{n}-rank-{rank}.json").read_text())
            base_for_rank = {**base, "TAG": f"t{n}-"}
            d_env = {**d["env"], "TAG": f"t{n}-"}  # TAG is ours, not a launcher's
            lines, fails = compare(t, {**d, "env": d_env}, base_for_rank)
            print(f"--- rank {rank} of {n}")
            print("\n".join(lines))
            total_fail += fails
            report["runs"].append({"nproc": n, "rank": rank, "lines": lines, "failures": fails})
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=2) + "\n")
    subprocess.run(["rm", "-rf", str(work)])
    verdict = "PASS" if total_fail == 0 else f"FAIL ({total_fail} failure(s) above)"
    print(f"\nTORCHRUN_CONTRACT {verdict}: torch {torch_version}, ddpctl torchrun against torchrun, "
          f"nproc {a.nproc}; differ by design: {', '.join(DIFFER)}")
    return 0 if total_fail == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
