#!/usr/bin/env bash
# The daemon path on the one-H200 machine (Ubuntu 24.04, not Debian): the portable ddp-agentd
# (the binary ddpctl --ssh uploads) runs with nothing of ours installed; then ddpctl launch
# --nodes --tls to it, `nccl.unique_id: on` made on node rank 0 (this agent) with the machine's
# NCCL 2.28, the raw NCCL worker and PyTorch's NCCL DDP script on the GPU.
#   ./tests/gpu/pack.sh, then with carry [".gpu"]:  bash tests/gpu/nodes_on_h200.sh
set -u
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
root=$PWD
B=$root/.gpu/bin
work=$(mktemp -d)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
section() { echo; echo "=== $* ==="; }

section "portable ddp-agentd on $(. /etc/os-release; echo "$PRETTY_NAME"), no LD_LIBRARY_PATH"
(readelf -d "$B/ddp-agentd" | grep NEEDED; env -u LD_LIBRARY_PATH "$B/ddp-agentd" --version) 2>&1 | tee "$out/agent_portable.txt"

export LD_LIBRARY_PATH=$root/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$work/token"; chmod 600 "$work/token"
"$B/ddp-agentd" --listen 127.0.0.1:29410 --token-file "$work/token" --log-dir "$work/agent-logs" \
  --tls required > "$work/agent.log" 2>&1 &
apid=$!
sleep 1

section "launch --nodes --tls: raw NCCL all-reduce, id from node rank 0's agent"
cat > "$work/nccl.yaml" <<YAML
name: nccl-nodes
nproc_per_node: 1
command: [$B/nccl_allreduce, -b, "8", -e, "1073741824", -f, "8", -w, "5", -n, "20"]
nccl: {unique_id: on}
logs: {dir: $work/logs}
YAML
(cd "$work" && timeout 300 "$B/ddpctl" launch --nodes 127.0.0.1 --tls --token-file "$work/token" nccl.yaml) 2>&1 | tee "$out/nccl_nodes_tls.txt"
echo "rc=${PIPESTATUS[0]}" | tee -a "$out/nccl_nodes_tls.txt"

section "launch --nodes --tls: DESIGN.md's script, backend=nccl, through the agent's store"
cat > "$work/train.yaml" <<YAML
name: gpu-ddp-nodes
nproc_per_node: gpu
command: [python3, $root/examples/python/train_ddp.py, --epochs, "2", --dump-params, "$work/params-{rank}.json", --checkpoint, "$work/ckpt.pt"]
env: {NCCL_DEBUG: WARN, PYTHONUNBUFFERED: "1"}
logs: {dir: $work/logs}
YAML
(cd "$work" && timeout 300 "$B/ddpctl" launch --nodes 127.0.0.1 --tls --token-file "$work/token" train.yaml) 2>&1 | tee "$out/train_nodes_tls.txt"
echo "rc=${PIPESTATUS[0]}" | tee -a "$out/train_nodes_tls.txt"
kill $apid; wait $apid 2>/dev/null
grep -h "TLS\|ncclid\|nccl" "$work/agent.log" | head -20 | tee "$out/agent_log_excerpt.txt"
