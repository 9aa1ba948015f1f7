#!/usr/bin/env bash
# dev/pf_trace/run.sh - builds and runs pf_trace.cu (the wgmma prefill's per-CTA-tile phase
# trace; see its header) on a GPU machine, from the root of a source tree:
#   bash dev/pf_trace/run.sh            (shapes: 32x256 narrow and wide, 8x1024 wide and narrow)
# Environment: SHAPES ("R Q C NARROW;..."), BUILD (build folder, default build-trace), OUT (raw
# CSVs go there when set). Needs nvcc and a GPU of compute capability 9.0; builds the static
# library for 90a only (about 40 s with 16 cores).
set -eu -o pipefail
BUILD=${BUILD:-build-trace}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF \
    -DKVA_WITH_CJSON=OFF > "$BUILD.cfg.log" 2>&1
ninja -C "$BUILD" -j"$(nproc)" kvattn_static > "$BUILD.build.log" 2>&1
nvcc -O3 -std=c++17 -arch=sm_90a -DKVA_CUDA_SM90A=1 -DKVA_HAVE_CUDA=1 -diag-suppress 177 \
    -Iinclude -Isrc/core -Isrc/plan -Isrc/attn/cuda dev/pf_trace/pf_trace.cu \
    "$BUILD/libkvattn.a" -lgomp -lpthread -lm -o "$BUILD/pf_trace"
IFS=';' read -ra S <<< "${SHAPES:-32 256 0 1;32 256 0 0;8 1024 0 0;8 1024 0 1}"
for s in "${S[@]}"; do
    set -- $s
    csv=(); [ -n "${OUT:-}" ] && csv=("$OUT/pf_trace_${1}x${2}+${3}_n${4}.csv")
    "$BUILD/pf_trace" "$1" "$2" "$3" "$4" ${csv[@]+"${csv[@]}"} || echo "pf_trace $s: exit $?"
done
