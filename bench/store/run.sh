#!/usr/bin/env bash
# Our store server against PyTorch's own TCPStore server (Debian's 1.13), same load, one run.
# Builds nothing: run scripts/build first. Prints ops/s, latency, server CPU-us per op and
# server memory, with ratios ours/theirs.
#   BUILD_DIR=...        build folder (default build)
#   CLIENTS=1,16,256     client counts
#   RUN_SECONDS=3        measured seconds per run (after 0.3 s of warm-up)
#   SERVER_THREADS=auto  our server's I/O threads (`store serve --threads`: 0, N or auto, a
#                        quarter of the cores); PyTorch's server is one thread whatever is asked
#   LOAD_THREADS=N       the load generator's epoll threads (default: half the cores, at least 2)
#   MODE=storm           instead of throughput: a connection storm (store_storm): CLIENTS (default
#                        4096) clients connect at once, then meet at a barrier; REPEATS (3) runs
#                        each, alternating; CONNS connections per client (default: 2 for 1.13's
#                        protocol, which opens a callback connection too; 1 for 2.x);
#                        STORM_TIMEOUT (30) seconds for one storm until it counts as failed
#   COMPARE_BUILD=DIR    also serve with DIR/bin/ddpctl (e.g. an older commit's build) as a third
#                        target, "before", in the same run
#   ROUNDS=1             throughput: rounds per client count, the targets in turn (reversed in
#                        every other round); each ratio is then the median of the rounds' ratios
#   FLOOR_THREADS=N      throughput: also serve with store_floor --threads N ("floor": the same
#                        epoll shape with no keyspace and no lock, the least a server can do)
#   FLOOR_SHARED=N       throughput: also serve with store_floor --threads N --shared ("floorsh": N
#                        threads on one epoll set, FLOOR_BATCH events per epoll_wait, default 16)
#   FLOOR_BLOCKING=1     throughput: also serve with store_floor --blocking ("floorblk": a thread
#                        per connection blocking in recv, the shortest path without busy-polling)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
ddpctl=$build/bin/ddpctl
mode=${MODE:-throughput}
case $mode in
  throughput) load=$build/bin/store_load ;;
  storm) load=$build/bin/store_storm ;;
  *) echo "run.sh: MODE is throughput or storm, not $mode" >&2; exit 2 ;;
esac
for b in "$ddpctl" "$load"; do
  [[ -x $b ]] || { echo "run.sh: $b is missing; run scripts/build first" >&2; exit 2; }
done
python=${PYTHON:-/usr/bin/python3}
"$python" -c "import torch" 2>/dev/null \
  || { echo "run.sh: $python has no torch (set PYTHON=...)" >&2; exit 2; }

# A storm holds CLIENTS x CONNS connections in each server and in the load generator at once.
ulimit -n "$(ulimit -Hn)"
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# Starts "$@" in the background; sets $started_pid and $started_port from its first line.
start() {
  local out=$work/out.$#.$RANDOM
  "$@" >"$out" 2>"$out.err" &
  started_pid=$!
  pids+=("$started_pid")
  for _ in $(seq 1 300); do
    if grep -q '^listening on ' "$out"; then
      started_port=$(sed -n 's/^listening on .*:\([0-9]*\)$/\1/p' "$out" | head -n1)
      return 0
    fi
    kill -0 "$started_pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "run.sh: $1 did not start listening:" >&2
  cat "$out.err" >&2
  exit 2
}

server_threads=${SERVER_THREADS:-auto}
load_threads=${LOAD_THREADS:-$(( $(nproc) / 2 > 2 ? $(nproc) / 2 : 2 ))}
DDP_LOG_LEVEL=warn start "$ddpctl" store serve --listen 127.0.0.1:0 --threads "$server_threads"
ours_pid=$started_pid ours_port=$started_port
start "$python" "$root/bench/store/torch_server.py"
torch_pid=$started_pid torch_port=$started_port
extra=()
if [[ -n ${COMPARE_BUILD:-} ]]; then
  DDP_LOG_LEVEL=warn start "$COMPARE_BUILD/bin/ddpctl" store serve --listen 127.0.0.1:0 --threads "$server_threads"
  extra=(--target "before=127.0.0.1:$started_port:$started_pid")
  echo "before: $COMPARE_BUILD/bin/ddpctl store serve (pid $started_pid, port $started_port)"
fi

# A floor server (store_floor ARGS...) as target NAME.
floor() {
  local name=$1
  shift
  start "$build/bin/store_floor" "$@"
  extra+=(--target "$name=127.0.0.1:$started_port:$started_pid")
  echo "$name: store_floor $* (pid $started_pid, port $started_port)"
}
if [[ $mode == throughput ]]; then
  [[ -z ${FLOOR_THREADS:-} ]] || floor floor --threads "$FLOOR_THREADS"
  [[ -z ${FLOOR_SHARED:-} ]] || floor floorsh --threads "$FLOOR_SHARED" --shared --batch "${FLOOR_BATCH:-16}"
  [[ -z ${FLOOR_BLOCKING:-} ]] || floor floorblk --blocking
fi

echo "ours:  ddpctl store serve --threads $server_threads (pid $ours_pid, port $ours_port)"
echo "torch: PyTorch $("$python" -c 'import torch; print(torch.__version__)') TCPStore(is_master=True) (pid $torch_pid, port $torch_port)"
echo "machine: $(nproc) cores; load generator ($load_threads threads) and both servers share them"
# The wire numbering the comparison server speaks: 1.13's for torch 1.x, 2.x's (VALIDATE first) after.
protocol=${PROTOCOL:-$("$python" -c 'import torch; print(2 if int(torch.__version__.split(".")[0]) >= 2 else 1)')}
if [[ $mode == storm ]]; then
  "$load" --protocol "$protocol" --target "ours=127.0.0.1:$ours_port:$ours_pid" --target "torch=127.0.0.1:$torch_port:$torch_pid" "${extra[@]}" \
    --clients "${CLIENTS:-4096}" --repeats "${REPEATS:-3}" --threads "$load_threads" \
    --timeout "${STORM_TIMEOUT:-30}" ${CONNS:+--conns "$CONNS"}
  exit
fi
"$load" --protocol "$protocol" --target "ours=127.0.0.1:$ours_port:$ours_pid" --target "torch=127.0.0.1:$torch_port:$torch_pid" "${extra[@]}" \
  --clients "${CLIENTS:-1,16,256}" --seconds "${RUN_SECONDS:-3}" --threads "$load_threads" --rounds "${ROUNDS:-1}"
