#!/usr/bin/env bash
# Issue 25's proof on the H200: the same script and flags under torchrun 2.11 (the venv's
# `python -m torch.distributed.run --standalone --nproc-per-node N`) and under `ddpctl torchrun`,
# each rank's environment contract compared variable by variable (tests/gpu/torchrun_contract.py;
# CI compares against Debian's 1.13 in tests/integration/launch/test_torchrun.py). gloo, 1 and 2
# processes: the contract does not need the GPU.
# Needs .gpu/ from tests/gpu/pack.sh; run with carry [".gpu"]:  bash tests/gpu/torchrun_on_h200.sh
# Pass: the last line "TORCHRUN_CONTRACT PASS ..." (exit 0); every FAIL line names a variable.
set -u
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
root=$PWD
export LD_LIBRARY_PATH=$root/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
B=${DDP_BIN:-$root/.gpu/bin}
PY=${PY:-/opt/torch/.venv/bin/python}
[[ -x $PY ]] || PY=$(command -v python3)
timeout 300 "$PY" "$root/tests/gpu/torchrun_contract.py" "$B/ddpctl" "$PY" --nproc 1,2 \
  --json "$out/torchrun_contract.json" 2>&1 | tee "$out/torchrun_contract.txt"
exit "${PIPESTATUS[0]}"
