#!/usr/bin/env bash
# A SIGKILLed ddpctl leaves no process on the GPU (docs/architecture.md, "A SIGKILLed launcher
# leaves nothing running"): one rank whose child (a data loader, say) holds CUDA memory; ddpctl
# is killed with -9; the attempt's guardian must end the child, so that the GPU lists no compute
# process. With the attempt's cgroup, then without one (DDP_NO_CGROUP=1: each rank's process
# group). Needs .gpu/ from tests/gpu/pack.sh; run with carry [".gpu"]:
#   bash tests/gpu/guardian_on_h200.sh
# DDPCTL=path runs another ddpctl (an older build, to see the check fail without the guardian).
# Prints GUARDIAN <mode> PASS|FAIL lines; exit 0 when both pass.
set -u
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
root=$PWD
export LD_LIBRARY_PATH=$root/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
B=$root/.gpu/bin
PY=${PY:-/opt/torch/.venv/bin/python}
[[ -x $PY ]] || PY=$(command -v python3)
work=$(mktemp -d)
cat > "$work/holder.py" <<'PY'
import os, time, torch
if os.fork() == 0:  # the rank's child: it holds the GPU, and PDEATHSIG never reaches it
    x = torch.ones(256 << 20, device="cuda")  # 1 GiB
    torch.cuda.synchronize()
    open("child.pid", "w").write(str(os.getpid()))
    time.sleep(600)
    os._exit(0)
time.sleep(600)
PY
cat > "$work/job.yaml" <<YAML
name: guardian
nproc_per_node: 1
command: [$PY, $work/holder.py]
workdir: $work
logs: {dir: $work/logs}
YAML
compute_pids() { nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | tr -d ' ' | grep -v '^$'; }
failed=0
for mode in cgroup no-cgroup; do
  rm -f "$work/child.pid"
  env_extra=()
  [[ $mode == no-cgroup ]] && env_extra=(DDP_NO_CGROUP=1)
  cd "$work"
  env "${env_extra[@]}" "${DDPCTL:-$B/ddpctl}" launch job.yaml -q > "$work/$mode.log" 2>&1 &
  launcher=$!
  cd "$root"
  for _ in $(seq 1 300); do [[ -s $work/child.pid ]] && break; sleep 0.1; done
  child=$(cat "$work/child.pid" 2>/dev/null || echo 0)
  before=$(compute_pids | tr '\n' ' ')
  kill -9 "$launcher"
  wait 2>/dev/null
  gone=no
  for _ in $(seq 1 100); do
    if ! kill -0 "$child" 2>/dev/null && ! compute_pids | grep -qx "$child"; then gone=yes; break; fi
    sleep 0.1
  done
  after=$(compute_pids | tr '\n' ' ')
  echo "$mode: launcher $launcher, child $child; compute processes before the kill: [$before] after: [$after]" \
    | tee -a "$out/guardian.txt"
  if [[ $child != 0 && $before == *"$child"* && $gone == yes ]]; then
    echo "GUARDIAN $mode PASS" | tee -a "$out/guardian.txt"
  else
    echo "GUARDIAN $mode FAIL" | tee -a "$out/guardian.txt"
    failed=1
    [[ $child != 0 ]] && kill -9 "$child" 2>/dev/null
  fi
done
cp "$work"/*.log "$out/" 2>/dev/null
rm -rf "$work"
exit $failed
