#!/usr/bin/env bash
# mla_sparse_cuda.sh - on a machine with an NVIDIA GPU: build the sparse MLA
# targets (sm_90a), run test_cuda_mla_sparse (full), compute-sanitizer
# memcheck on its quick set, then `kvattn bench --mla-sparse --backend cuda`
# (issue 17's targets in one run), and optionally Nsight Compute on the
# decode H 128 shape.
#   OUT               logs (default build-sparse/out)
#   KVA_STEPS         default "test memcheck bench"; add "ncu" for the profile
#   KVA_STEP_TIMEOUT  seconds per step (default 240)
#   KVA_CMAKE_EXTRA   extra cmake arguments (e.g. -DCMAKE_CUDA_FLAGS=-lineinfo)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build-sparse/out}
mkdir -p "$out"
steps=" ${KVA_STEPS:-test memcheck bench} "
has() { [[ "$steps" == *" $1 "* ]]; }
status=0
tmo=${KVA_STEP_TIMEOUT:-240}
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
cmake -S . -B build-sparse -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF \
  -DKVA_WITH_CJSON=OFF ${KVA_CMAKE_EXTRA:-} >"$out/cmake.log" 2>&1 || { tail -30 "$out/cmake.log"; exit 1; }
timeout 420 ninja -C build-sparse -j"$(nproc)" test_cuda_mla_sparse kvattn_cli \
  >"$out/build.log" 2>&1 || { grep -E "error|Error" "$out/build.log" | head -30; tail -20 "$out/build.log"; exit 1; }
echo "== built in $(( $(date +%s) - t0 )) s"
if has test; then
  timeout "$tmo" build-sparse/test_cuda_mla_sparse >"$out/test.log" 2>&1 || status=1
  grep -E "FAILED|CHECK|passed|failed|bad [1-9]" "$out/test.log" | head -30
  tail -3 "$out/test.log"
fi
if has memcheck; then
  KVA_TEST_QUICK=1 timeout "$tmo" compute-sanitizer --tool memcheck build-sparse/test_cuda_mla_sparse \
    >"$out/memcheck.log" 2>&1 || status=1
  echo "memcheck: $(grep -E 'ERROR SUMMARY' "$out/memcheck.log" | tail -1); $(tail -1 "$out/memcheck.log")"
fi
if has bench; then
  timeout "$tmo" build-sparse/kvattn bench --mla-sparse --backend cuda --iters 20 2>&1 |
    tee "$out/bench.log" || status=1
fi
if has ncu; then
  timeout "$tmo" ncu --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis \
    -k regex:"mla_wgmma_kernel|mla_decode_mma_kernel" -c 1 build-sparse/kvattn bench --mla-sparse --backend cuda \
    --iters 1 --batch 128 --q-len 2 --context 8192 --heads 128 --topk 2048 >"$out/ncu.log" 2>&1 || status=1
  grep -E "Duration|Throughput|Stall|Issued|Warp Cycles|L2 Hit|Registers" "$out/ncu.log" | head -30
fi
echo "== done in $(( $(date +%s) - t0 )) s, status $status"
exit $status
