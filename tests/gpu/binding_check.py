"""Run as a ddpctl worker on a GPU machine: does an unchanged `set_device(LOCAL_RANK)` script
open the GPU the plan gave this rank, and do the CPUs and memory policy match its NUMA node?
Prints one JSON line; exits 1 when the rank's GPU is not the planned one."""
import json
import os
import subprocess
import sys

import torch

lr = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(lr)  # what DDP scripts do
props = torch.cuda.get_device_properties(lr)
uuid = "GPU-" + str(props.uuid) if hasattr(props, "uuid") else None
visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
planned = visible.split(",")[lr] if visible else None
bus = subprocess.run(["nvidia-smi", "--query-gpu=uuid,pci.bus_id", "--format=csv,noheader"], capture_output=True,
                     text=True).stdout.strip().splitlines()
bus_of = {u.strip(): b.strip() for u, b in (line.split(",") for line in bus)}
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
policy = ""
try:
    policy = next((line.split()[1] for line in open("/proc/self/numa_maps") if " heap " in line), "")
except OSError:
    pass
x = torch.ones(1 << 20, device="cuda")
out = {"rank": int(os.environ["RANK"]), "local_rank": lr, "cuda_visible_devices": visible, "planned_uuid": planned,
       "opened_uuid": uuid, "opened_bus": bus_of.get(uuid or "", "?"), "sum": float(x.sum()),
       "cpus": status["Cpus_allowed_list"].strip(), "mem_policy": policy, "nccl_ib_hca": os.environ.get("NCCL_IB_HCA")}
print("BINDING " + json.dumps(out), flush=True)
sys.exit(0 if planned and uuid == planned else 1)
