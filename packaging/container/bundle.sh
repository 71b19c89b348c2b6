#!/usr/bin/env bash
# Makes the build context of packaging/container/Dockerfile: ddpctl, ddp-agentd and ddp-ncclid
# with every shared library they load, glibc and its loader included, under opt/ddpctl/.
#
# Why a bundle: the binaries are built on Debian 12 (glibc 2.36); pytorch-cuda images are other
# distributions (NGC's are Ubuntu), whose glibc may be older and whose yaml-cpp, spdlog, fmt and
# libssh are other versions or absent. Each program runs through the bundled loader with
# --library-path, which applies to that process only: nothing like LD_LIBRARY_PATH leaks into
# the workers it starts, which keep the image's own libraries (its NCCL, its libstdc++).
#
# usage: packaging/container/bundle.sh [BUILD_DIR] [OUT_DIR]   (defaults: build, build/container-context)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
out=${2:-$build/container-context}
rm -rf "$out"
mkdir -p "$out/opt/ddpctl/bin" "$out/opt/ddpctl/libexec" "$out/opt/ddpctl/lib"
cp "$root/packaging/container/Dockerfile" "$out/"
loader=$(readlink -f /lib64/ld-linux-x86-64.so.2)
cp -L "$loader" "$out/opt/ddpctl/lib/ld-linux-x86-64.so.2"
for prog in ddpctl ddp-agentd ddp-ncclid; do
  cp "$build/bin/$prog" "$out/opt/ddpctl/libexec/$prog"
  # "libfoo.so.1 => /path/libfoo.so.1 (0x...)": the resolved path of every dependency.
  ldd "$build/bin/$prog" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | while read -r lib; do
    cp -L "$lib" "$out/opt/ddpctl/lib/$(basename "$lib")"
  done
  cat > "$out/opt/ddpctl/bin/$prog" <<WRAP
#!/bin/sh
exec /opt/ddpctl/lib/ld-linux-x86-64.so.2 --library-path /opt/ddpctl/lib /opt/ddpctl/libexec/$prog "\$@"
WRAP
  chmod 755 "$out/opt/ddpctl/bin/$prog"
done
# Loaded when first called, so ldd above does not list them: OpenSSL, which ddpctl's multi-node
# modes, TLS and image digests need (lib/common/openssl_lazy.hpp). The loader's --library-path
# covers dlopen too. (libssh, libsystemd and libdw are not bundled: SSH mode, the journal and
# native stacks are not for inside an image, and each says what is missing when asked.)
for soname in libssl.so.3 libcrypto.so.3; do
  # awk reads to the end: an early exit would kill ldconfig with SIGPIPE, which pipefail reports.
  path=$(/sbin/ldconfig -p | awk -v s="$soname" '$1 == s && /x86-64/ && p == "" {p = $NF} END {print p}')
  [[ -n $path ]] || { echo "bundle.sh: $soname not found (apt-get install libssl3)" >&2; exit 1; }
  cp -L "$path" "$out/opt/ddpctl/lib/$soname"
done
echo "$out"
