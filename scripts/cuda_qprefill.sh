#!/usr/bin/env bash
# cuda_qprefill.sh - on a machine with an NVIDIA GPU: prefill over quantized
# caches, the tensor-core kernel (prefill_mma_quant.h) against the CUDA-core
# kernel of attn_quant.cu and the bf16 prefill, in one run: build (bench_cuda,
# test_cuda_quant_prefill, test_cuda_quant, test_cuda_quant_attn), the tests, the benchmark
# (4 x 1024 after 3072 cached and 1 x 4096 fresh, causal, H/Hkv 32/8, D 128,
# bf16 q), compute-sanitizer memcheck of the quick test set.
#   OUT                 folder for logs (default build-cuda/out)
#   KVA_CMAKE_ARGS      extra cmake arguments (e.g. -DXXHASH_LIB=...)
#   KVA_QP_STEPS        steps (default "build test bench memcheck"; also "quant": the
#                       quick sets of test_cuda_quant and test_cuda_quant_attn, "quick": the quick set of this test
#                       instead of the full one), run in this file's order
#   (the tensor-core kernel runs one configuration per format: prefill_mma_quant.cuh)
#   KVA_QP_OLD          1 (default): also time the CUDA-core kernel (--kernel prefill_items)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build-cuda/out}
mkdir -p "$out"
steps=" ${KVA_QP_STEPS:-build test bench memcheck} "
has() { [[ "$steps" == *" $1 "* ]]; }
status=0
b=build-cuda/bench_cuda
t=build-cuda/test_cuda_quant_prefill

if has build; then
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$out/gpu.txt"
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a ${KVA_CMAKE_ARGS:-} >"$out/cmake.log" 2>&1 || { tail -30 "$out/cmake.log"; exit 1; }
  ninja -C build-cuda -j"$(nproc)" bench_cuda test_cuda_quant_prefill test_cuda_quant test_cuda_quant_attn >"$out/build.log" 2>&1 ||
    { grep -m20 -A3 "error" "$out/build.log"; tail -20 "$out/build.log"; exit 1; }
  echo "build ok"
fi

run_test() { # name, quick (0/1), binary
  start=$(date +%s)
  if [ "$2" = 1 ]; then export KVA_TEST_QUICK=1; else unset KVA_TEST_QUICK; fi
  timeout ${KVA_QP_TEST_TIMEOUT:-300} "$3" >"$out/$1.log" 2>&1
  rc=$?
  unset KVA_TEST_QUICK
  echo "$1: exit $rc in $(( $(date +%s) - start )) s; $(tail -1 "$out/$1.log")"
  [ $rc = 0 ] || { grep -m12 -i -A1 "fail\|mismatch\|case " "$out/$1.log"; status=1; }
}
has quick && run_test quick_qprefill 1 $t
has test && run_test test_qprefill 0 $t
has quant && run_test quick_quant 1 build-cuda/test_cuda_quant
has quant && run_test quick_quant_attn 1 build-cuda/test_cuda_quant_attn

if has bench; then
  a="--mode prefill --batch 4 --context 3072 --q-len 1024 --iters 10"
  c="--mode prefill --batch 1 --context 0 --q-len 4096 --iters 10"
  {
  for s in "$a" "$c"; do
    $b $s 2>&1 | head -1
    for qf in int8 int8-token int8-token-v16 fp8; do
      [ "${KVA_QP_OLD:-1}" = 1 ] && $b $s --quant $qf --kernel prefill_items --iters 3 2>&1 | head -1
      $b $s --quant $qf 2>&1 | head -1
    done
  done
  } | sed 's/^bench_cuda: //' | tee "$out/bench_qprefill.log"
fi

if has memcheck; then
  KVA_TEST_QUICK=1 timeout ${KVA_MEMCHECK_TIMEOUT:-240} compute-sanitizer --tool memcheck \
    --error-exitcode 9 $t >"$out/memcheck_qprefill.log" 2>&1
  rc=$?
  echo "memcheck test_cuda_quant_prefill (quick): exit $rc; $(grep 'ERROR SUMMARY' "$out/memcheck_qprefill.log" | tail -1)"
  [ $rc = 0 ] || { grep -m10 -A6 "=========" "$out/memcheck_qprefill.log"; status=1; }
fi

exit $status
