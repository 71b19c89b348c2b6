#!/usr/bin/env bash
# The hang watchdog (job file `hang:`) under NCCL on the H200 (docs/gpu.md), which gloo on CPU
# cannot show: a rank waiting for an NCCL collective spins a core.
#  1. rank 1 stuck in Python, rank 0 waiting in dist.barrier() (NCCL: an all_reduce the host
#     waits for inside torch.distributed), hang: {timeout: 20s, action: stop}: ddpctl exits 124 naming the hang and stuck_forever, and
#     the verdict comes no sooner than 20 s after both ranks joined and within 20 s + 2.5 s
#     (one sample interval) + a few seconds of start-up slack;
#  2. rank 0 computing silently on the GPU for 60 s (three timeouts) while rank 1 waits: exit 0,
#     no "hung".
#  3. (measured, not asserted) rank 0 waiting for an all_reduce in torch.cuda.synchronize():
#     docs/architecture.md expects NO verdict there (the host spins outside torch.distributed,
#     as a healthy GPU-bound loop does); the job is then stopped by `timeout 90`.
# Needs .gpu/ from tests/gpu/pack.sh; run with carry [".gpu"]:   bash tests/gpu/hang_on_h200.sh
#  0. while check 1 hangs, `ddpctl stacks hang-nccl` names rank 1 in stuck_forever and rank 0 in
#     barrier/all_reduce.
# Pass: the line "hang_on_h200: PASS" (and exit code 0).
set -u
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
root=$PWD
export LD_LIBRARY_PATH=$root/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
B=$root/.gpu/bin
PY=${PY:-/opt/torch/.venv/bin/python}
[[ -x $PY ]] || PY=$(command -v python3.12)
work=$(mktemp -d)
cp "$root/tests/gpu/hang_nccl_worker.py" "$work/"
cd "$work"
fail=0
printf 'name: hang-nccl\nnproc_per_node: 2\ncommand: [%s, hang_nccl_worker.py, hang]\nhang: {timeout: 20s, action: stop}\nstop: {grace: 5s}\nbinding: {gpu: none, numa: none, nic: none}\n' "$PY" > hang.yaml
start=$(date +%s.%N)
timeout 300 "$B/ddpctl" launch hang.yaml --master-port 0 --job-id hang-nccl > "$out/hang_stdout.txt" 2> "$out/hang_stderr.txt" &
launch=$!
# While it hangs: `ddpctl stacks` names rank 1 in stuck_forever and rank 0 in the collective.
for _ in $(seq 1 120); do
  [[ $(grep -c 'joined at' "$out/hang_stdout.txt" 2>/dev/null) -ge 2 ]] && break
  sleep 0.5
done
sleep 3
"$B/ddpctl" stacks hang-nccl > "$out/hang_stacks.txt" 2>&1
echo "=== ddpctl stacks hang-nccl (exit $?)"; cat "$out/hang_stacks.txt"
# Two groups of one rank each (ties go to the lower rank): rank 1's frames hold stuck_forever,
# rank 0's the collective.
python3 - "$out/hang_stacks.txt" <<'PY' || fail=1
import re, sys
groups = re.split(r"^(?=ranks? )", open(sys.argv[1]).read(), flags=re.M)
by_rank = {g.split()[1]: g for g in groups if g.startswith("rank ")}
ok = "stuck_forever" in by_rank.get("1", "") and re.search(r"barrier|all_reduce", by_rank.get("0", ""))
print("ok: stacks name rank 1 in stuck_forever and rank 0 in the collective" if ok else
      "FAIL: stacks do not name rank 1 in stuck_forever and rank 0 in the collective")
sys.exit(0 if ok else 1)
PY
wait $launch
rc=$?
end=$(date +%s.%N)
cat "$out/hang_stdout.txt" "$out/hang_stderr.txt"
joined=$(grep -o 'joined at [0-9.]*' "$out/hang_stdout.txt" | awk '{print $3}' | sort -n | tail -1)
verdict=$(grep -m1 -n 'hung: no rank made progress for 20s' "$out/hang_stderr.txt" >/dev/null && echo yes)
echo "=== rc $rc; joined $joined; ddpctl ended $end (started $start)"
[[ $rc == 124 ]] || { echo "FAIL: exit code $rc, expected 124"; fail=1; }
[[ $verdict == yes ]] || { echo "FAIL: no hang verdict"; fail=1; }
grep -q stuck_forever "$out/hang_stderr.txt" || { echo "FAIL: rank 1's function not named"; fail=1; }
if [[ -n $joined ]]; then
  python3 - "$joined" "$end" <<'PY' || fail=1
import sys
joined, end = map(float, sys.argv[1:])
took = end - joined  # the verdict, then a stop of at most the 5 s grace
print(f"verdict+stop {took:.1f} s after both joined (timeout 20 s, grace 5 s)")
if took < 20:
    print("FAIL: before the timeout"); sys.exit(1)
if took > 20 + 2.5 + 5 + 10:
    print("FAIL: long after the timeout"); sys.exit(1)
PY
fi
printf 'name: silent-nccl\nnproc_per_node: 2\ncommand: [%s, hang_nccl_worker.py, silent, "60"]\nhang: {timeout: 20s, action: stop}\nstop: {grace: 5s}\nbinding: {gpu: none, numa: none, nic: none}\n' "$PY" > silent.yaml
timeout 300 "$B/ddpctl" launch silent.yaml --master-port 0 --job-id silent-nccl > "$out/silent_stdout.txt" 2> "$out/silent_stderr.txt"
rc=$?
cat "$out/silent_stdout.txt" "$out/silent_stderr.txt"
[[ $rc == 0 ]] || { echo "FAIL: the silent job ended with $rc"; fail=1; }
grep -q hung "$out/silent_stderr.txt" && { echo "FAIL: the silent job was called hung"; fail=1; }
printf 'name: sync-nccl\nnproc_per_node: 2\ncommand: [%s, hang_nccl_worker.py, hang-sync]\nhang: {timeout: 20s, action: stop}\nstop: {grace: 5s}\nbinding: {gpu: none, numa: none, nic: none}\n' "$PY" > sync.yaml
timeout -s INT 90 "$B/ddpctl" launch sync.yaml --master-port 0 --job-id sync-nccl > "$out/sync_stdout.txt" 2> "$out/sync_stderr.txt"
echo "=== measured: rank 0 in torch.cuda.synchronize(): exit $?; verdict: $(grep -c 'hung: no rank' "$out/sync_stderr.txt") (0 expected, see docs/architecture.md)"
cp -r "$work/logs" "$out/" 2>/dev/null
[[ $fail == 0 ]] && echo "hang_on_h200: PASS" || echo "hang_on_h200: FAIL"
exit $fail
