#!/usr/bin/env bash
# ab.sh - issue 23's host plan rows, base vs new, in one GPU call (host29).
# Builds both trees in parallel (sm_90a; the targets below only), runs NEW's
# CUDA plan/attention tests (test_cuda_attn quick) while BASE still builds,
# then alternates base, new, base, new (ROUNDS, default 2) over
#   - kvattn serve-sim --backend cuda, default workload, SERVE_REPS runs each
#     (default 4): host plan share of the step and of decode-only steps, mean
#     step; new also once with --plan-probe 1 (the plan's phases), and with
#     the hot staging ring's half set to each of HOTS (default "0 524288";
#     0 = no hot ring, main's staging; new's default is 128K), serve-sim and
#     the probe: the same binary with and without the change;
#   - bench_plan: the serve-sim decode sequence, "cuda update" per plan
#     (back to back, unreserved context);
#   - bench_cuda decode per call, bf16 16 x 1k and 64 x 4k.
# SAN=1 adds compute-sanitizer memcheck of test_cuda_plan_update.
# Usage (from a folder holding both trees):
#   KVA_DEBS=$PWD/debs OUT=... bash new/dev/host29/ab.sh base new
# Log: $OUT/h29.txt; the other logs go into $OUT/logs.tgz.
set -uo pipefail
base=$(cd "$1" && pwd); new=$(cd "$2" && pwd)
out=${OUT:-$PWD/out}; mkdir -p "$out"; LOG=$out/h29.txt; L=/tmp/h29logs; mkdir -p $L
. "$new/scripts/device_deps.sh"; extra=(${KVA_DEP_ARGS[@]+"${KVA_DEP_ARGS[@]}"})
say() { echo "$*" | tee -a "$LOG"; }
pack() { tar -czf "$out/logs.tgz" -C $L . 2>/dev/null; }
say "# gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"
say "# host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)"
B=/tmp/h29b; t0=$(date +%s); T() { say "## $1: $(( $(date +%s) - t0 )) s"; }
TESTS="test_cuda_attn test_cuda_plan_update test_cuda_graph test_plan test_plan_grid test_plan_update"
for t in base new; do
  cmake -S ${!t} -B $B/$t -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a "${extra[@]}" >"$L/cmake_$t.log" 2>&1 ||
    { tail -20 "$L/cmake_$t.log" | tee -a "$LOG"; pack; exit 1; }
done
ninja -C $B/base -j5 kvattn bench_plan bench_cuda >"$L/build_base.log" 2>&1 &
bpid=$!
ninja -C $B/new -j11 kvattn bench_plan bench_cuda $TESTS >"$L/build_new.log" 2>&1 ||
  { grep -m20 -B2 -A6 error "$L/build_new.log" | tee -a "$LOG"; pack; exit 1; }
T "build new"
# Tests: test_cuda_attn quick (KVA_TEST_QUICK=1), the plan tests full; at most
# four at a time, while base builds.
for x in $TESTS; do
  q=0; [ $x = test_cuda_attn ] && q=1
  ( KVA_TEST_QUICK=$q timeout 240 $B/new/$x >"$L/t_$x.log" 2>&1
    echo "test $x (quick $q) rc=$? $(tail -1 "$L/t_$x.log")" >>"$L/tests.txt" ) &
  while [ "$(jobs -rp | wc -l)" -ge 4 ]; do sleep 0.5; done
done
wait
cat "$L/tests.txt" | tee -a "$LOG"
T tests
pack
wait $bpid 2>/dev/null; [ -x $B/base/kvattn ] || { tail -20 "$L/build_base.log" | tee -a "$LOG"; pack; exit 1; }
serve() { # tag tree [args]: SERVE_REPS runs
  local tag=$1 t=$2; shift 2
  for k in $(seq 1 ${SERVE_REPS:-4}); do
    $B/$t/kvattn serve-sim --backend cuda --no-progress "$@" >"$L/serve_$tag.$k.log" 2>&1
    say "$tag.$k serve rc=$? $(grep -E 'plan share|of decode-only step|Mean step' "$L/serve_$tag.$k.log" | tr -s ' ' | tr '\n' ';')"
  done
}
bc() { local tag=$1 t=$2; shift 2; say "$tag $("$B/$t/bench_cuda" "$@" 2>&1 >/dev/null | grep -m1 '^bench_cuda:' |
  grep -oE 'R=[0-9]+ S=[0-9]+|kv [a-z0-9_]+|median [0-9.]+ ms|check [a-z]+|back to back [0-9.]+ ms' | tr '\n' ' ')"; }
for r in $(seq 1 ${ROUNDS:-2}); do
  for t in base new; do
    serve $t-r$r $t
    say "$t-r$r $($B/$t/bench_plan --iters 101 2>&1 | grep 'serve-sim default')"
    bc $t-r$r $t --mode decode --batch 16 --context 1023
    bc $t-r$r $t --mode decode --batch 64 --context 4095
  done
  $B/new/kvattn serve-sim --backend cuda --no-progress --plan-probe 1 >"$L/probe_r$r.log" 2>&1
  say "new-r$r probe rc=$? $(grep -E 'plan share|of decode-only step|Mean step|plan probe' "$L/probe_r$r.log" | tr -s ' ' | tr '\n' ';')"
  for h in ${HOTS-0 524288}; do
    serve new-r$r-hot$h new --cuda-staging-hot $h
    $B/new/kvattn serve-sim --backend cuda --no-progress --plan-probe 1 --cuda-staging-hot $h >"$L/probe_r$r-hot$h.log" 2>&1
    say "new-r$r-hot$h probe rc=$? $(grep -E 'plan probe' "$L/probe_r$r-hot$h.log" | tr -s ' ')"
    say "new-r$r-hot$h $($B/new/bench_plan --iters 101 --staging-hot $h 2>&1 | grep 'serve-sim default')"
  done
  T "round $r"
  pack
done
# Medians over every serve-sim run of a row (the share moves by 1-2 points
# between runs of one binary): plan share of the step, of decode-only steps.
med() { sort -n | awk '{a[NR]=$1} END {if (NR) printf "%s", (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
for t in base new $(for h in ${HOTS-0 524288}; do echo hot$h; done); do
  case $t in hot*) pat="^new-r[0-9]+-$t\.[0-9]+ serve" ;; *) pat="^$t-r[0-9]+\.[0-9]+ serve" ;; esac
  n=$(grep -Ec "$pat" "$LOG")
  a=$(grep -E "$pat" "$LOG" | sed -E 's/.*of step time \(%\): ([0-9.]+);.*/\1/' | med)
  d=$(grep -E "$pat" "$LOG" | sed -E 's/.*decode-only step time \(%\): ([0-9.]+);.*/\1/' | med)
  say "median $t ($n serve-sim runs): plan share $a % | of decode-only steps $d %"
done
if [ -n "${SAN:-}" ]; then
  KVA_TEST_QUICK=1 timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 $B/new/test_cuda_plan_update \
    >"$L/san.log" 2>&1
  say "memcheck test_cuda_plan_update rc=$? $(grep -E 'ERROR SUMMARY' "$L/san.log" | tail -1)"
  T san
fi
pack
