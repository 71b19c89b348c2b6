#!/usr/bin/env bash
# Binding on a real GPU node (docs/gpu.md): the local launch and an agent (multi-node path over
# loopback), each running tests/gpu/binding_check.py with nproc_per_node: gpu. Needs .gpu/ from
# tests/gpu/pack.sh; run with carry [".gpu"]: bash tests/gpu/binding_on_h200.sh
set -u
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
root=$PWD
export LD_LIBRARY_PATH=$root/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
B=$root/.gpu/bin
work=$(mktemp -d)
cat > "$work/bind.yaml" <<YAML
name: gpu-binding
nproc_per_node: gpu
command: [python3, $root/tests/gpu/binding_check.py]
logs: {dir: $work/logs}
store: {port: 29531}
YAML
echo "=== nvidia-smi topo / numa"; nvidia-smi --query-gpu=index,uuid,pci.bus_id --format=csv | tee "$out/gpus.csv"
numactl -H | head -4
echo "=== dry-run plan"; (cd "$work" && "$B/ddpctl" launch --dry-run bind.yaml) > "$out/binding_plan.json"; echo "rc=$?"
python3 -c "import json;p=json.load(open('$out/binding_plan.json'));[print(r['rank'], r['binding']) for r in p['ranks']]"
echo "=== local launch"; (cd "$work" && timeout 120 "$B/ddpctl" launch bind.yaml) 2>&1 | tee "$out/binding_local.txt"; echo "rc=${PIPESTATUS[0]}"
echo "=== through an agent (multi-node path, loopback)"
umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$work/token"; echo >> "$work/token"
"$B/ddp-agentd" --listen 127.0.0.1:29410 --token-file "$work/token" --log-dir "$work/agent-logs" --gpus 0 > "$work/agent.log" 2>&1 &
apid=$!
sleep 1
(cd "$work" && timeout 120 "$B/ddpctl" launch --nodes 127.0.0.1 --token-file "$work/token" bind.yaml) 2>&1 | tee "$out/binding_agent.txt"; echo "rc=${PIPESTATUS[0]}"
kill $apid; wait $apid 2>/dev/null
cp "$work/agent.log" "$out/binding_agent_daemon.log"
rm -rf "$work"
