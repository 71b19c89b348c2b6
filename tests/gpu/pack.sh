#!/usr/bin/env bash
# Copies what tests/gpu/run_on_h200.sh needs into .gpu/ (ignored by git): the binaries from
# build/bin and the libraries they need that an Ubuntu 24.04 CUDA image may lack (Debian 12's
# spdlog, fmt, yaml-cpp, libdw and libelf); glibc and libstdc++ there are newer, so these binaries run there.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$root/.gpu/bin" "$root/.gpu/lib"
exclude=$(git -C "$root" rev-parse --git-path info/exclude)  # a worktree keeps it elsewhere
mkdir -p "$(dirname "$exclude")"; grep -qxF '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
for b in ddpctl ddp-ncclid ddp-agentd nccl_allreduce nccl_id_floor timed_run store_load store_storm store_floor fake_agents; do cp "$root/build/bin/$b" "$root/.gpu/bin/"; done
# libdw/libelf: ddpctl's native stack reader (lib/stacks); the image may have other versions or none.
for lib in libspdlog.so.1.10 libfmt.so.9 libyaml-cpp.so.0.7 libdw.so.1 libelf.so.1; do
  cp -L "/lib/x86_64-linux-gnu/$lib" "$root/.gpu/lib/"
done
# The commit the binaries were built from (the device machine's copy may have no .git); "+dirty"
# when the tree had uncommitted changes.
{ git -C "$root" rev-parse HEAD | tr -d '\n'; [[ -z $(git -C "$root" status --porcelain --untracked-files=no) ]] || printf '+dirty'; echo; } > "$root/.gpu/COMMIT"
du -sh "$root/.gpu"
