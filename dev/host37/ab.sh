#!/usr/bin/env bash
# ab.sh - issue 23's host plan rows, base vs new, in one GPU call (host37).
# Builds new (sm_90a; kvattn, bench_plan, its plan tests) and
# dev/host37/copy_probe.cu, then runs new's tests (test_cuda_attn quick,
# test_cuda_plan_update, the plan tests) and compute-sanitizer memcheck of
# test_cuda_plan_update (quick) while base builds, then with nothing else
# running:
#   - copy_probe 20 (the fill and the copy by variant, one process);
#   - ROUNDS (default 3) rounds of base, new alternated: serve-sim --backend
#     cuda default SERVE_REPS (default 2) runs each, one --plan-probe 1 run
#     each (the plan's phases; base has the same probe), new also
#     --plan-probe 4 (an event record before the plan: the first-submission
#     experiment), and new with the hot staging ring's half set to each of
#     HOTS (default "0 524288"; 0 = no hot ring), one serve-sim run and one
#     probe each; bench_plan's serve-sim sequence (back-to-back cuda update);
# Medians last.
# Usage (from a folder holding both trees and debs/):
#   KVA_DEBS=$PWD/debs OUT=... bash new/dev/host37/ab.sh base new
# Log: $OUT/h37.txt; the other logs go into $OUT/logs.tgz.
set -uo pipefail
base=$(cd "$1" && pwd); new=$(cd "$2" && pwd)
out=${OUT:-$PWD/out}; mkdir -p "$out"; LOG=$out/h37.txt; L=/tmp/h37logs; mkdir -p $L
. "$new/scripts/device_deps.sh"; extra=(${KVA_DEP_ARGS[@]+"${KVA_DEP_ARGS[@]}"})
say() { echo "$*" | tee -a "$LOG"; }
pack() { tar -czf "$out/logs.tgz" -C $L . 2>/dev/null; }
say "# gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"
say "# host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)"
B=/tmp/h37b; t0=$(date +%s); T() { say "## $1: $(( $(date +%s) - t0 )) s"; }
TESTS="test_cuda_attn test_cuda_plan_update test_plan test_plan_grid test_plan_update"
for t in base new; do
  cmake -S ${!t} -B $B/$t -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a "${extra[@]}" >"$L/cmake_$t.log" 2>&1 ||
    { tail -20 "$L/cmake_$t.log" | tee -a "$LOG"; pack; exit 1; }
done
nvcc -O2 -arch=sm_90a -Xcompiler -mprfchw -o $B/copy_probe "$new/dev/host37/copy_probe.cu" >"$L/nvcc.log" 2>&1 &
ninja -C $B/new -j16 kvattn bench_plan $TESTS >"$L/build_new.log" 2>&1 ||
  { grep -m20 -B2 -A6 error "$L/build_new.log" | tee -a "$LOG"; pack; exit 1; }
T "build new"
# New's tests (quick attention set, the plan tests full) and memcheck, while
# base builds; the timing below waits for both.
ninja -C $B/base -j10 kvattn bench_plan >"$L/build_base.log" 2>&1 &
bpid=$!
for x in $TESTS; do
  q=0; [ $x = test_cuda_attn ] && q=1
  ( KVA_TEST_QUICK=$q timeout 300 $B/new/$x >"$L/t_$x.log" 2>&1
    echo "test $x (quick $q) rc=$? $(tail -1 "$L/t_$x.log")" >>"$L/tests.txt" ) &
done
( KVA_TEST_QUICK=1 timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 \
    $B/new/test_cuda_plan_update >"$L/san.log" 2>&1
  echo "memcheck test_cuda_plan_update (quick) rc=$? $(grep -E 'ERROR SUMMARY' "$L/san.log" | tail -1)" >>"$L/tests.txt" ) &
wait $bpid; [ -x $B/base/kvattn ] || { tail -20 "$L/build_base.log" | tee -a "$LOG"; pack; exit 1; }
T "build base"
wait
cat "$L/tests.txt" | tee -a "$LOG"
T tests
pack
[ -x $B/copy_probe ] && $B/copy_probe 20 2>&1 | tee -a "$LOG"
sv() { # tag kind tree [args]: one serve-sim run, its summary rows
  local tag=$1 kind=$2 t=$3; shift 3
  $B/$t/kvattn serve-sim --backend cuda --no-progress "$@" >"$L/${kind}_$tag.log" 2>&1
  say "$tag $kind rc=$? $(grep -E 'plan share|of decode-only step|Mean step|plan time|plan probe' "$L/${kind}_$tag.log" | tr -s ' ' | tr '\n' ';')"
}
for r in $(seq 1 ${ROUNDS:-3}); do
  for t in base new; do
    for k in $(seq 1 ${SERVE_REPS:-2}); do sv $t-r$r.$k serve $t; done
    sv $t-r$r probe1 $t --plan-probe 1
    [ $t = new ] && sv new-r$r probe4 new --plan-probe 4
    say "$t-r$r $($B/$t/bench_plan --iters 101 2>&1 | grep 'serve-sim default')"
  done
  for h in ${HOTS-0 524288}; do
    sv hot$h-r$r.1 serve new --cuda-staging-hot $h
    sv hot$h-r$r probe1 new --plan-probe 1 --cuda-staging-hot $h
  done
  T "round $r"
  pack
done
# Medians over the runs of a row: the plan share of the step, of decode-only steps.
med() { sort -n | awk '{a[NR]=$1} END {if (NR) printf "%s", (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
for t in base new hot0 hot524288; do
  pat="^$t-r[0-9]+\.[0-9]+ serve"
  n=$(grep -Ec "$pat" "$LOG")
  a=$(grep -E "$pat" "$LOG" | sed -E 's/.*of step time \(%\): ([0-9.]+);.*/\1/' | med)
  d=$(grep -E "$pat" "$LOG" | sed -E 's/.*decode-only step time \(%\): ([0-9.]+);.*/\1/' | med)
  p=$(grep -E "^$t-r[0-9]+ probe1" "$LOG" | sed -E 's/.*median us\): total ([0-9.]+) .*/\1/' | med)
  say "median $t ($n serve-sim runs): plan share $a % | of decode-only steps $d % | probe total $p us"
done
pack
