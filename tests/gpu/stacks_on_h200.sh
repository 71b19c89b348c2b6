#!/usr/bin/env bash
# The stack reader (lib/stacks) on the H200 (docs/gpu.md): Python 3.12 frames of the machine's
# venv read from outside (threads with file:line, gloo ranks in all_reduce vs stuck), then
# bench/stacks on a machine that is not loaded (the stop window here is the real one).
# Needs .gpu/ from tests/gpu/pack.sh (with libdw, which ddpctl now loads); run with
# carry [".gpu"]:   bash tests/gpu/stacks_on_h200.sh
# Pass: the line "stacks_check: PASS" (and exit code 0); the bench lines are the measurement.
set -u
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
root=$PWD
export LD_LIBRARY_PATH=$root/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
B=$root/.gpu/bin
PY=${PY:-/opt/torch/.venv/bin/python}
[[ -x $PY ]] || PY=$(command -v python3.12)
echo "=== kernel.yama.ptrace_scope: $(cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null || echo 'no Yama'); uid $(id -u)"
python3 "$root/tests/gpu/stacks_check.py" "$B/ddpctl" "$PY" 2>&1 | tee "$out/stacks_check.txt"
rc=${PIPESTATUS[0]}
echo "=== bench/stacks"
DDPCTL=$B/ddpctl PYTHON=$PY READS=30 python3 "$root/bench/stacks/run.py" 2>&1 | tee "$out/stacks_bench.txt"
exit $rc
