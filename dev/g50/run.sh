#!/usr/bin/env bash
# g50's one GPU call (staged by dev/g50/stage.sh): first the quantized decode
# A/B alone (bench_cuda 64 x 4k int8 / fp8, base and new alternated), then
# every test in parallel processes (one GPU, 16 cores), each under its own
# time limit: test_cuda_graph (+ its planted fault), test_cuda_plan_update
# one process per case, test_cuda_nan (+ main's quantized q staging: must
# fail), test_cuda_hidden (+ planted fault; and KVA_TEST_HIDDEN_STRICT=1 over
# every kernel: the map), compute-sanitizer memcheck of test_cuda_nan,
# test_cuda_mla_nan, test_cuda_hidden, test_cuda_graph. Logs under $OUT.
here=$(cd "$(dirname "$0")" && pwd); out=${OUT:-/tmp/out}; mkdir -p "$out/l"; L=$out/g50.log
t0=$(date +%s); T() { echo "[$(( $(date +%s) - t0 )) s] $*" >>"$L"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >>"$L" 2>&1
cd "$here" && xz -T0 -dc bins.tar.xz | tar -x && T "unpacked"
B=$here/bin
# 1) A/B alone: base, new alternated (two rounds, order flipped)
ab() { local bin=$1 lab=$2 q=$3
  "$B/$bin" --mode decode --batch 64 --context 4095 --iters 100 --quant $q >$out/l/ab.txt 2>&1
  grep -a "^bench_cuda:" $out/l/ab.txt | sed "s/^/$lab /" >>$out/l/ab_all.txt; }
for q in int8 fp8; do ab bench_cuda_base "r1-base $q" $q; ab bench_cuda "r1-new $q" $q; done
[ "${ROUNDS:-2}" -ge 2 ] &&
  for q in int8 fp8; do ab bench_cuda "r2-new $q" $q; ab bench_cuda_base "r2-base $q" $q; done
T "A/B done"; cat $out/l/ab_all.txt >>"$L"
# 2) tests in parallel
export KVA_TEST_QUICK=1 KVA_TEST_TIMES=1 OMP_NUM_THREADS=4
TL=${TL:-100}
job() { local name=$1; shift
  ( s=$(date +%s); timeout $TL "$@" >$out/l/$name.log 2>&1; rc=$?
    echo "[$(( $(date +%s) - t0 )) s] $name rc=$rc ($(( $(date +%s) - s )) s): $(grep -a -E 'passed|FAILED|not taken' $out/l/$name.log | tail -2 | tr '\n' ' ' | cut -c1-240)" >>$out/l/jobs.txt ) & }
job graph $B/test_cuda_graph
job graph_fault env KVA_TEST_ONLY=test_graph_replay $B/test_cuda_graph_fault
for c in test_update_sequence test_update_sequence_reserved test_update_decode_steps \
  test_update_pipelined test_update_unpadded test_update_padded test_update_mixed_pad test_staging_hot; do
  job pu_$c env KVA_TEST_ONLY=$c $B/test_cuda_plan_update
done
job nan $B/test_cuda_nan
job nan_old $B/test_cuda_nan_old
job hidden $B/test_cuda_hidden
job hidden_fault $B/test_cuda_hidden_fault
job hidden_strict env -u KVA_TEST_QUICK KVA_TEST_HIDDEN_STRICT=1 $B/test_cuda_hidden
CS="compute-sanitizer --tool memcheck --error-exitcode 9"
job mc_nan $CS $B/test_cuda_nan
job mc_mla_nan $CS $B/test_cuda_mla_nan
job mc_hidden $CS $B/test_cuda_hidden
job mc_graph $CS $B/test_cuda_graph
wait
T "tests done"
sort -t'[' -k2 -n $out/l/jobs.txt >>"$L"
{ echo "--- times (KVA_TEST_TIMES)"; grep -a -H " s wall " $out/l/graph.log $out/l/pu_*.log | sed "s|$out/l/||"
  echo "--- graph progress"; grep -a -E "layers|capture" $out/l/graph.log
  echo "--- nan: -inf rows and wrong rows"; grep -a -E "FAIL|CHECK" $out/l/nan.log | head -20
  echo "--- nan_old (must fail)"; grep -a -E "CHECK failed" $out/l/nan_old.log | head -12
  grep -a -E "wrong\)" $out/l/nan_old.log | grep -v "(0 wrong), NaN [0-9]* (0), -inf [0-9]* (0), NaN element [0-9]* (0)" | head -12
  echo "--- hidden_fault / graph_fault (must fail)"; grep -a "CHECK failed" $out/l/hidden_fault.log $out/l/graph_fault.log | head -6
  echo "--- hidden strict: the map"; grep -a -E "^  -> |cases run" $out/l/hidden_strict.log | sort | uniq -c | head -80
  echo "--- memcheck summaries"; grep -a -H "ERROR SUMMARY" $out/l/mc_*.log
} >>"$L" 2>&1
(cd $out && tar -czf logs.tgz l && rm -rf l)
cat "$L"
