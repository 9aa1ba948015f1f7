#!/usr/bin/env bash
# test_package.sh - the C packages: installs kvattn from a configured build
# directory into a temporary prefix and builds and runs examples/consumer
# against it through find_package(kvattn) (shared and static library) and
# pkg-config (shared and --static); then builds the library with
# KVA_WITH_OPENSSL/XXHASH/CJSON=OFF (build-nodeps/, CPU only, library only),
# checks that it links none of them and that the calls needing them fail with
# KVA_STATUS_UNSUPPORTED (an -O0 build: quick to compile).
# Usage: scripts/test_package.sh [build-dir] (default build).
set -euo pipefail
cd "$(dirname "$0")/.."
bdir=${1:-build}
jobs=${KVA_JOBS:-$(nproc)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# consume PREFIX NAME [consumer flags]: both ways, both libraries.
consume() {
  local prefix=$1 name=$2
  shift 2
  cmake -S examples/consumer -B "$tmp/cm-$name" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
    >"$tmp/cm-$name.log" || { cat "$tmp/cm-$name.log"; return 1; }
  ninja -C "$tmp/cm-$name" >/dev/null
  "$tmp/cm-$name/consumer" "$@"
  "$tmp/cm-$name/consumer_static" "$@"
  local pc
  pc=$(dirname "$(ls "$prefix"/lib*/pkgconfig/kvattn.pc)")
  mkdir -p "$tmp/pc-$name"
  PKG_CONFIG_PATH=$pc make -s -C examples/consumer OUT="$tmp/pc-$name" >/dev/null
  PKG_CONFIG_PATH=$pc make -s -C examples/consumer OUT="$tmp/pc-$name" STATIC=1 >/dev/null
  "$tmp/pc-$name/consumer_pc" "$@"
  "$tmp/pc-$name/consumer_pc_static" "$@"
}

echo "-- install $bdir, consume via find_package and pkg-config"
cmake --install "$bdir" --prefix "$tmp/full" >/dev/null
for f in include/kvattn.h include/kvattn_cache.h include/kvattn_merge.h include/kvattn_mla.h include/kvattn_pool.h include/kvattn_dcp.h include/kvattn_c8.h include/kvattn_cuda.h lib/cmake/kvattn/kvattnConfig.cmake; do
  [ -f "$tmp/full/$f" ] || { echo "install: $f missing" >&2; exit 1; }
done
consume "$tmp/full" full

echo "-- build without OpenSSL, xxHash and cJSON (build-nodeps)"
# -O0 and the portable CPU kernels only (KVA_CPU_SIMD=OFF; the SIMD kernel
# files were ~50 of this build's ~60 CPU s): this build only checks linking
# and statuses, and compiles in a fraction of a Release build's time.
cmake -S . -B build-nodeps -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_FLAGS_DEBUG=-O0 -DKVA_CUDA=OFF \
  -DKVA_CPU_SIMD=OFF \
  -DKVA_BUILD_TESTS=OFF -DKVA_BUILD_TOOLS=OFF \
  -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF -DKVA_WITH_CJSON=OFF >/dev/null
ninja -C build-nodeps -j"$jobs" >/dev/null
cmake --install build-nodeps --prefix "$tmp/nodeps" >/dev/null
if readelf -d "$tmp/nodeps"/lib*/libkvattn.so | grep -E 'NEEDED.*(crypto|xxhash|cjson)'; then
  echo "libkvattn.so of the no-deps build still needs the libraries above" >&2
  exit 1
fi
if grep -E -- '-l(crypto|xxhash|cjson)' "$tmp/nodeps"/lib*/pkgconfig/kvattn.pc; then
  echo "kvattn.pc of the no-deps build still lists the libraries above" >&2
  exit 1
fi
consume "$tmp/nodeps" nodeps --no-pool-hashes --no-c8-loader
echo "-- C packages ok"
