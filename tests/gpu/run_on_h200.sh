#!/usr/bin/env bash
# What docs/gpu.md reports, in one batch on the one-H200 machine (the `device` tool):
#   ./tests/gpu/pack.sh here (copies binaries and their non-glibc libraries into .gpu/), then
#   run with carry [".gpu"]:  bash tests/gpu/run_on_h200.sh
# Every section writes its output under $OUT (or ./gpu-out).
set -u
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
root=$PWD
export LD_LIBRARY_PATH=$root/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
B=$root/.gpu/bin
work=$(mktemp -d)
section() { echo; echo "=== $* ==="; }

section environment
{ nvidia-smi -L; python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count(), "nccl", torch.cuda.nccl.version())'; uname -r; } 2>&1 | tee "$out/env.txt"

section "ddpctl doctor"
"$B/ddpctl" doctor 2>&1 | tee "$out/doctor.txt"
"$B/ddpctl" doctor --json > "$out/doctor.json" 2>"$out/doctor-json.err"; echo "doctor --json rc=$?"

section "PyTorch $(python3 -c 'import torch;print(torch.__version__)') client against ddpctl's store (every op), captured"
"$B/ddpctl" store serve --listen 127.0.0.1:0 > "$work/store.out" 2>&1 &
spid=$!
for _ in $(seq 50); do grep -q '^listening on' "$work/store.out" && break; sleep 0.1; done
port=$(sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$work/store.out")
timeout 120 python3 tests/gpu/store_client_check.py --port "$port" --capture "$out/captured_torch211_client.txt" 2>&1 | tee "$out/store_check.txt"
kill $spid; wait $spid 2>/dev/null

section "DESIGN.md's script with backend=nccl, launched by ddpctl (nproc_per_node: gpu)"
cat > "$work/train.yaml" <<YAML
name: gpu-ddp
nproc_per_node: gpu
command: [python3, $root/examples/python/train_ddp.py, --epochs, "3", --dump-params, "$work/params-{rank}.json", --checkpoint, "$work/ckpt.pt"]
env: {NCCL_DEBUG: WARN, PYTHONUNBUFFERED: "1"}
logs: {dir: $work/logs}
YAML
(cd "$work" && timeout 300 "$B/ddpctl" launch train.yaml --result-json "$out/train_result.json") 2>&1 | tee "$out/train.txt"
echo "train rc=${PIPESTATUS[0]}"
grep -h "NCCL\|backend" "$work"/logs/*/attempt-0/rank-0.log | head -5

section "issue 22: the job's PyTorch as ddpctl sees it, and no warning caused by ddpctl's environment"
# The dry-run names the interpreter and the async-error-handling variable chosen for its release;
# every rank log of the training run above must be free of PyTorch's "Environment variable X is
# deprecated" warning (2.2 and later print it for NCCL_ASYNC_ERROR_HANDLING).
{
  (cd "$work" && "$B/ddpctl" launch train.yaml --dry-run) > "$work/dry.json" 2>"$work/dry.err"
  python3 - "$work/dry.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
node = p["nodes"][0]
py = node["python"] or {}
print("dry-run python:", py.get("interpreter"), py.get("version"), "torch", py.get("torch"), "|", "async names:",
      " ".join(node["async_error_handling"]["names"]))
PY
  "$B/ddpctl" doctor | sed -n '/^python/,/^$/p'
  logs=$(ls "$work"/logs/*/attempt-0/rank-*.log 2>/dev/null)
  n=$(printf '%s\n' "$logs" | grep -c .)
  bad=$(grep -l -E "Environment variable [A-Z_]+ is deprecated" $logs 2>/dev/null)
  tv=$(python3 -c 'from importlib import metadata; print(metadata.version("torch"))')
  if [ "$n" -gt 0 ] && [ -z "$bad" ] && grep -q '"TORCH_NCCL_ASYNC_ERROR_HANDLING"' "$work/dry.json" \
     && ! grep -q '"NCCL_ASYNC_ERROR_HANDLING"' "$work/dry.json"; then
    echo "ISSUE22 PASS: PyTorch $tv, $n rank log(s), no deprecated-variable warning, only TORCH_NCCL_ASYNC_ERROR_HANDLING set"
  else
    echo "ISSUE22 FAIL: PyTorch $tv, $n rank log(s); warned in: ${bad:-none}"
    grep -h -E "is deprecated" $logs 2>/dev/null | head -4
  fi
} 2>&1 | tee "$out/issue22.txt"

section "raw NCCL all-reduce from ddpctl's broadcast id (1 rank) vs the same worker with its own id"
cat > "$work/nccl.yaml" <<YAML
name: nccl-allreduce
nproc_per_node: 1
command: [$B/nccl_allreduce, -b, "8", -e, "4294967296", -f, "4", -w, "5", -n, "20"]
nccl: {unique_id: on}
logs: {dir: $work/logs}
YAML
(cd "$work" && timeout 300 "$B/ddpctl" launch nccl.yaml) 2>&1 | tee "$out/nccl_ddpctl.txt"
echo "ddpctl nccl rc=${PIPESTATUS[0]}"
RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 NCCL_SOCKET_IFNAME=lo timeout 300 \
  "$B/nccl_allreduce" -b 8 -e 4294967296 -f 4 -w 5 -n 20 --self-id "$work/self.id" 2>&1 | tee "$out/nccl_byhand.txt"
echo "by-hand nccl rc=${PIPESTATUS[0]}"

section "ddp-ncclid: id decodes to the workers' interface, listener gone after"
DDP_BINARY_DIR=$root/.gpu timeout 120 python3 -m pytest -q -p no:cacheprovider tests/integration/nccl 2>&1 | tail -15 | tee "$out/ncclid_tests.txt"

section "store throughput: ours vs PyTorch's libuv TCPStore server"
BUILD_DIR=$root/.gpu PYTHON=python3 RUN_SECONDS=3 timeout 200 bash bench/store/run.sh 2>&1 | tee "$out/store_bench.txt"

section "launch overhead: ddpctl vs torchrun (this machine's PyTorch)"
timeout 200 python3 bench/launch/run.py --ddpctl "$B/ddpctl" --python python3 --repeats 10 2>&1 | tee "$out/launch_bench.txt"
rm -rf "$work"
