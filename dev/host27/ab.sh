#!/usr/bin/env bash
# ab.sh - issue 23's host-time rows, base vs new, in one GPU call (host27):
# builds both trees in parallel (sm_90a, the targets below only), runs NEW's
# CUDA plan/attention tests, the runtime-call microbenchmark rt_cost.cu, then
# alternates base, new, base, new over
#   - kvattn serve-sim --backend cuda (default workload): host plan share of
#     the step, of decode-only steps, most plan time in a step, mean step;
#   - bench_plan: its serve-sim decode sequence, "cuda update" per plan;
#   - bench_cuda quantized decode per call (int8 C8, int8 per-token, fp8) at
#     16 x 1k and 64 x 4k, and bf16 16 x 1k as a control (median per call,
#     back to back, host enqueue).
# Usage (from a folder holding both trees): OUT=... bash new/dev/host27/ab.sh base new
# KVA_DEBS: build dependencies as .deb files (scripts/device_deps.sh). Logs to $OUT/h27.txt.
set -uo pipefail
base=$(cd "$1" && pwd); new=$(cd "$2" && pwd)
out=${OUT:-$PWD/out}; mkdir -p "$out"; LOG=$out/h27.txt
. "$new/scripts/device_deps.sh"; extra=(${KVA_DEP_ARGS[@]+"${KVA_DEP_ARGS[@]}"})
say() { echo "$*" | tee -a "$LOG"; }
say "# gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"
say "# host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)"
B=/tmp/h27b; t0=$(date +%s); T() { say "## $1: $(( $(date +%s) - t0 )) s"; }
TESTS="test_cuda_attn test_cuda_quant_attn test_cuda_plan_update test_cuda_graph test_plan test_plan_grid test_plan_update"
for t in base new; do
  cmake -S ${!t} -B $B/$t -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a "${extra[@]}" >"$out/cmake_$t.log" 2>&1 ||
    { tail -20 "$out/cmake_$t.log"; exit 1; }
done
nvcc -O2 -arch=sm_90a -o $B/rt_cost "$new/dev/host27/rt_cost.cu" >"$out/rt_build.log" 2>&1 &
ninja -C $B/base -j7 kvattn bench_plan bench_cuda >"$out/build_base.log" 2>&1 &
ninja -C $B/new -j9 kvattn bench_plan bench_cuda $TESTS >"$out/build_new.log" 2>&1 ||
  { grep -m20 -B2 -A6 error "$out/build_new.log" | tee -a "$LOG"; exit 1; }
wait || { tail -20 "$out/build_base.log" | tee -a "$LOG"; exit 1; }
T build
say "$($B/rt_cost 2>&1)"
T rt_cost
# Tests: the attention tests quick (KVA_TEST_QUICK=1), the plan tests full; three at a time.
for x in $TESTS; do
  q=0; case $x in test_cuda_attn|test_cuda_quant_attn) q=1 ;; esac
  ( KVA_TEST_QUICK=$q timeout 150 $B/new/$x >"$out/t_$x.log" 2>&1
    echo "test $x (quick $q) rc=$? $(tail -1 "$out/t_$x.log")" >>"$out/tests.txt" ) &
  while [ "$(jobs -rp | wc -l)" -ge 3 ]; do sleep 0.2; done
done
wait
cat "$out/tests.txt" | tee -a "$LOG"
T tests
bc() { local tag=$1; shift; say "$tag $("$B/${tag%%-*}/bench_cuda" "$@" 2>&1 >/dev/null | grep -m1 '^bench_cuda:' |
  grep -oE 'R=[0-9]+ S=[0-9]+|kv [a-z0-9_]+|median [0-9.]+ ms|check [a-z]+|host enqueue median [0-9.]+ us|back to back [0-9.]+ ms' | tr '\n' ' ')"; }
for r in 1 2; do
  for t in base new; do
    $B/$t/kvattn serve-sim --backend cuda --no-progress >"$out/serve_${t}_$r.log" 2>&1
    say "$t-r$r serve rc=$? $(grep -E 'plan share|of decode-only step|most in a step|Mean step|Engine steps' "$out/serve_${t}_$r.log" | tr -s ' ' | tr '\n' ';')"
    say "$t-r$r $($B/$t/bench_plan --iters 101 2>&1 | grep 'serve-sim default')"
    for s in "16 1023" "64 4095"; do
      set -- $s
      for qn in int8 int8-token fp8; do bc $t-r$r --mode decode --batch $1 --context $2 --quant $qn; done
    done
    bc $t-r$r --mode decode --batch 16 --context 1023
  done
  T "round $r"
done
if [ -n "${SAN:-}" ]; then
  KVA_TEST_QUICK=1 timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $B/new/test_cuda_quant_attn \
    >"$out/san_quant.log" 2>&1
  say "memcheck test_cuda_quant_attn (quick) rc=$? $(grep -E 'ERROR SUMMARY' "$out/san_quant.log" | tail -1)"
  T san
fi
