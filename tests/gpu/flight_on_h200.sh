#!/usr/bin/env bash
# PyTorch's NCCL flight recorder under ddpctl on the H200 (issue 24 item 5; docs/gpu.md):
# 2 ranks on the one GPU (tests/gpu/flight_rank.py), rank 1 sleeps in Python while rank 0 waits
# in all_reduce #4. Checks, in order:
#   1. the dry-run says the flight recorder is on for this PyTorch;
#   2. while the job hangs, both ranks' FIFOs are in the attempt folder and a byte written to
#      each makes that rank dump (the trigger ddpctl's watchdog uses: hang::request_dump);
#   3. NCCL's timeout (30 s) ends rank 0, ddpctl stops rank 1, and the report names the collective.
# Needs .gpu/ from tests/gpu/pack.sh; run with carry [".gpu"]:   bash tests/gpu/flight_on_h200.sh
# Pass: the line "flight_check: PASS" (exit code 0). The report line itself, one of
#   flight recorder: rank 0 entered all_reduce #4 (pg 0, 4 MiB), rank 1 did not
#   flight recorder: rank 0 entered all_reduce #4 (pg 0, 4 MiB) and none completed it; no dump from rank 1
# (the second where rank 1 was stopped before it dumped), is in $OUT/flight_launch.txt.
set -u
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
root=$PWD
export LD_LIBRARY_PATH=$root/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
B=$root/.gpu/bin
PY=${PY:-python3}
work=$(mktemp -d)
fail=0
check() { if eval "$2"; then echo "ok: $1"; else echo "FAIL: $1"; fail=1; fi; }

"$PY" -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version())' | tee "$out/flight_env.txt"
cat > "$work/flight.yaml" <<YAML
name: flight
nproc_per_node: 2
python: $PY
command: [$PY, $root/tests/gpu/flight_rank.py]
env: {PYTHONUNBUFFERED: "1", NCCL_P2P_DISABLE: "1", NCCL_SHM_DISABLE: "1", NCCL_IB_DISABLE: "1", FLIGHT_TIMEOUT_S: "30"}
logs: {dir: $work/logs}
binding: {gpu: none, numa: none, nic: none}
YAML

(cd "$work" && "$B/ddpctl" launch flight.yaml --dry-run) > "$work/dry.json" 2>"$work/dry.err"
"$PY" - "$work/dry.json" <<'PY' | tee "$out/flight_dry.txt"
import json, sys
d = json.load(open(sys.argv[1]))
print("flight_recorder:", json.dumps(d["nodes"][0].get("flight_recorder")))
print("rank 0 env:", {k: v for k, v in d["ranks"][0]["env"].items() if "TORCH_NCCL" in k or "TORCH_FR" in k})
PY
check "dry-run: flight recorder on" 'grep -q "\"on\": true" "$out/flight_dry.txt"'

(cd "$work" && timeout 300 "$B/ddpctl" launch flight.yaml > "$out/flight_launch.txt" 2>&1; echo "launch rc=$?" >> "$out/flight_launch.txt") &
lpid=$!
att=""
for _ in $(seq 120); do  # the job starting, NCCL up, rank 1 asleep: at most 2 minutes
  att=$(ls -d "$work"/logs/flight-*/attempt-0 2>/dev/null | head -1)
  [[ -n $att && -p $att/nccl-flight-rank-0.pipe && -p $att/nccl-flight-rank-1.pipe ]] &&
    grep -q "stuck in Python" "$att/rank-1.log" 2>/dev/null && break
  sleep 1
done
check "both ranks made their FIFO in the attempt folder" '[[ -p $att/nccl-flight-rank-0.pipe && -p $att/nccl-flight-rank-1.pipe ]]'
for r in 0 1; do timeout 5 sh -c "printf d > $att/nccl-flight-rank-$r.pipe"; done
for _ in $(seq 20); do [[ -s $att/nccl-flight-rank-0 && -s $att/nccl-flight-rank-1 ]] && break; sleep 1; done
check "a write to each FIFO made that rank dump" '[[ -s $att/nccl-flight-rank-0 && -s $att/nccl-flight-rank-1 ]]'
cp "$att"/nccl-flight-rank-0 "$out/requested-rank-0.pkl" 2>/dev/null
cp "$att"/nccl-flight-rank-1 "$out/requested-rank-1.pkl" 2>/dev/null
"$PY" -I -c "$(cat "$root/lib/hang/flight_convert.py")" "$att" --all > "$out/requested_summaries.jsonl" 2>&1

wait $lpid
cat "$out/flight_launch.txt"
ls -l "$att" > "$out/flight_attempt_ls.txt" 2>&1
check "the job failed on NCCL's timeout" 'grep -q "launch rc=1" "$out/flight_launch.txt"'
check "the report names the collective" 'grep -q "flight recorder: rank 0 entered all_reduce #[0-9]* (pg 0, 4 MiB)" "$out/flight_launch.txt"'
[[ $fail == 0 ]] && echo "flight_check: PASS" || echo "flight_check: FAIL"
exit $fail
