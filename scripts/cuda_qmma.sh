#!/usr/bin/env bash
# cuda_qmma.sh - on a machine with an NVIDIA GPU: the versions of the
# quantized tensor-core decode kernel (decode_mma_quant.cu) side by side, in
# one run with the copy ceiling and the bf16 kernel: build (bench_cuda,
# test_cuda_quant, test_cuda_quant_attn, kvattn), the quick quantized test sets, the decode benchmark
# per version and format, other shapes, optionally Nsight Compute sections.
#   OUT              folder for logs (default build-cuda/out)
#   KVA_CMAKE_ARGS   extra cmake arguments (e.g. -DXXHASH_LIB=...)
#   KVA_QMMA_STEPS   steps (default "build quick bench shapes"; also "ncu", "full",
#                    "memcheck", "cli"), run in this file's order
#   KVA_QMMA_SHAPE_VERS  passes of the "shapes" step (default "2": one pass)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build-cuda/out}
mkdir -p "$out"
steps=" ${KVA_QMMA_STEPS:-build quick bench shapes} "
has() { [[ "$steps" == *" $1 "* ]]; }
status=0
b=build-cuda/bench_cuda
d="--mode decode --batch 64 --context 4095"
vers="default"  # the version knob is gone (one kernel); kept as one pass

if has build; then
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$out/gpu.txt"
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a ${KVA_CMAKE_ARGS:-} >"$out/cmake.log" 2>&1 || { tail -30 "$out/cmake.log"; exit 1; }
  ninja -C build-cuda -j"$(nproc)" bench_cuda test_cuda_quant test_cuda_quant_attn kvattn_cli >"$out/build.log" 2>&1 ||
    { tail -40 "$out/build.log"; exit 1; }
  echo "build ok"
fi





if has quick; then
  for t in test_cuda_quant test_cuda_quant_attn; do
    KVA_TEST_QUICK=1 timeout 300 build-cuda/$t >"$out/quick_$t.log" 2>&1
    rc=$?
    echo "quick $t: exit $rc; $(tail -1 "$out/quick_$t.log")"
    [ $rc = 0 ] || status=1
  done
fi

if has bench; then
  {
  $b --mode copy --iters 20 2>&1 | head -1
  $b $d 2>&1 | head -1
  for v in $vers; do
    for qf in int8 int8-token fp8; do $b $d --quant $qf 2>&1 | head -1; done
  done
  $b $d --quant int8-token-v16 2>&1 | head -1
  $b $d --quant int8-token-v16 --kernel decode_simt 2>&1 | head -1
  $b $d --dtype f16 --quant int8-token-v16 2>&1 | head -1
  $b $d --dtype f16 2>&1 | head -1
  $b $d 2>&1 | head -1
  } | sed 's/^bench_cuda: //' | tee "$out/bench_qmma.log"
fi

if has cli; then
  {
  build-cuda/kvattn bench --backend cuda --batch 64 --context 4095 --iters 20 2>&1
  build-cuda/kvattn bench --backend cuda --batch 64 --context 4095 --kv-quant int8 --iters 20 \
    --no-ceiling 2>&1
  build-cuda/kvattn bench --backend cuda --mode mixed --sinks --alibi --iters 5 --no-ceiling 2>&1
  } >"$out/cli_cuda.log"
  echo "cli exit ${PIPESTATUS[0]}"
  grep -E "kvattn|check|attention median|bandwidth" "$out/cli_cuda.log"
fi

if has full; then
  for t in test_cuda_quant test_cuda_quant_attn; do
    start=$(date +%s)
    timeout ${KVA_FULL_TIMEOUT:-400} build-cuda/$t >"$out/full_$t.log" 2>&1
    rc=$?
    echo "full $t: exit $rc in $(( $(date +%s) - start )) s; $(tail -1 "$out/full_$t.log")"
    [ $rc = 0 ] || grep -m8 -i -B1 "fail\|mismatch\|case " "$out/full_$t.log"
    [ $rc = 0 ] || status=1
  done
fi

if has memcheck; then
  for t in test_cuda_quant test_cuda_quant_attn; do
    KVA_TEST_QUICK=1 timeout ${KVA_MEMCHECK_TIMEOUT:-300} compute-sanitizer --tool memcheck --error-exitcode 9 \
      build-cuda/$t >"$out/memcheck_$t.log" 2>&1
    rc=$?
    echo "memcheck $t: exit $rc; $(grep 'ERROR SUMMARY' "$out/memcheck_$t.log" | tail -1)"
    [ $rc = 0 ] || status=1
  done
fi

if has shapes; then
  {
  for v in ${KVA_QMMA_SHAPE_VERS:-2}; do
    $b --mode decode --batch 64 --context 4095 --head-dim 64 --quant int8 2>&1 | head -1
    $b --mode decode --batch 32 --context 4095 --head-dim 256 --heads 16 --kv-heads 4 --quant int8 2>&1 | head -1
    $b --mode decode --batch 64 --context 4092 --q-len 4 --quant int8 2>&1 | head -1
    $b --mode decode --batch 4 --context 32767 --quant int8 2>&1 | head -1
    $b $d --heads 64 --kv-heads 8 --quant int8 2>&1 | head -1
    $b $d --batch 16 --quant int8 2>&1 | head -1
  done
  $b --mode decode --batch 64 --context 4095 --head-dim 64 2>&1 | head -1
  $b --mode decode --batch 32 --context 4095 --head-dim 256 --heads 16 --kv-heads 4 2>&1 | head -1
  $b --mode decode --batch 64 --context 4092 --q-len 4 2>&1 | head -1
  $b --mode decode --batch 4 --context 32767 2>&1 | head -1
  $b $d --batch 16 2>&1 | head -1
  $b --mode decode --batch 64 --context 4095 --head-dim 64 --quant int8-token-v16 2>&1 | head -1
  $b --mode decode --batch 32 --context 4095 --head-dim 256 --heads 16 --kv-heads 4 --quant int8-token-v16 2>&1 | head -1
  $b --mode decode --batch 64 --context 4092 --q-len 4 --quant int8-token-v16 2>&1 | head -1
  } | sed 's/^bench_cuda: //' | tee "$out/bench_shapes.log"
fi

if has ncu; then
  sec="--section SpeedOfLight --section WarpStateStats --section Occupancy --section SchedulerStats"
  for v in default; do
    timeout 120 ncu -k regex:decode_mma --launch-skip 2 --launch-count 1 $sec --print-details all \
      $b $d --quant int8 --iters 1 >"$out/ncu_int8_v$v.txt" 2>&1
    grep -E "Duration|Memory Throughput|Stall|Issued Warp|Warp Cycles|Achieved Occupancy|No Eligible" \
      "$out/ncu_int8_v$v.txt" | head -30 | sed "s/^/v$v /"
  done
fi

exit $status
