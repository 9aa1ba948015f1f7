#!/usr/bin/env bash
# prefill_mma_bench.sh - builds kvattn with CUDA, runs the prefill kernel's test
# (full, then the small mode under compute-sanitizer memcheck), its benchmark,
# and torch SDPA (flash and cuDNN backends) on the same shapes, in one go, for
# one call on a GPU machine. Logs go to $OUT (or ./prefill_bench_out).
# The benchmark times every prefill kernel that exists on the device (mma.sync;
# on sm_90a at D 128 the wgmma kernel with and without TMA).
# Usage: bench/prefill_mma_bench.sh [arch]   (arch default 90a)
# Environment: KVA_CMAKE_ARGS extra cmake arguments; RACECHECK=0 skips
# racecheck; SDPA=0 skips the torch peers; PROFILE=1 adds ncu (PVAR kernel, kva__cuda_prefill_kernel).
set -u -o pipefail
OUT=${OUT:-prefill_bench_out}
mkdir -p "$OUT"
ARCH=${1:-90a}
. scripts/device_deps.sh   # the .deb files of missing build dependencies
EXTRA=(${KVA_DEP_ARGS[@]+"${KVA_DEP_ARGS[@]}"})
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
cmake -S . -B b -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DKVA_BUILD_TESTS=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$ARCH" "${EXTRA[@]}" ${KVA_CMAKE_ARGS:-} > "$OUT/build.log" 2>&1 &&
    ninja -C b -j"$(nproc)" test_cuda_prefill_mma cuda_prefill_bench >> "$OUT/build.log" 2>&1 ||
    { tail -40 "$OUT/build.log"; exit 1; }
echo "== test"
./b/test_cuda_prefill_mma 2>&1 | tee "$OUT/test.log" | tail -25
echo "== memcheck (small)"
compute-sanitizer --tool memcheck --error-exitcode 9 ./b/test_cuda_prefill_mma small 2>&1 |
    tee "$OUT/memcheck.log" | tail -6
if [ "${RACECHECK:-1}" = 1 ]; then
echo "== racecheck (small)"
compute-sanitizer --tool racecheck --error-exitcode 9 ./b/test_cuda_prefill_mma small 2>&1 |
    tee "$OUT/racecheck.log" | tail -4
fi
echo "== kvattn prefill kernel"
./b/cuda_prefill_bench 2>&1 | tee "$OUT/bench.log"
if [ "${PROFILE:-0}" = 1 ]; then
    echo "== ncu (shape 0, kernel ${PVAR:-2})"
    cuobjdump -sass b/cuda_prefill_bench > "$OUT/bench.sass" 2>&1
    ncu -k regex:prefill_mma_kernel -c 1 --section SpeedOfLight --section WarpStateStats \
        --section SchedulerStats --section Occupancy --section LaunchStats \
        --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
        ./b/cuda_prefill_bench 0 "${PVAR:-2}" > "$OUT/ncu.txt" 2>&1
    grep -E "Duration|Throughput|Issue|Eligible|Active Warps|Stall|Registers|Achieved|Block Limit|Pipe|Bank" "$OUT/ncu.txt" | head -40
fi
[ "${SDPA:-1}" = 1 ] || exit 0
echo "== torch SDPA (same shapes, contiguous K/V expanded to H heads)"
PYTHONUNBUFFERED=1 python3 bench/prefill_sdpa_peer.py 2>&1 | tee "$OUT/sdpa.log"
