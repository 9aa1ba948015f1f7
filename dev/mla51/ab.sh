#!/usr/bin/env bash
# dev/mla51/ab.sh - one device call for mla51 (issue 16): main's dense MLA
# wgmma decode against branch mla51's (Q staged by cp.async, issued ahead of
# the item's first tile and waited for just before the item's first barrier),
# from binaries prebuilt on the dev VM (dev/mla51/side.sh + stage.sh; nothing
# is built on the device):
#   base   main 2d5f8b2's two wgmma MLA objects
#   new    branch mla51's (only mla_decode_wgmma.cu's SASS differs)
#   box    branch mla51-box (new + S waiting per TMA box instead of per
#          fill part: only the two TMA kernels differ from new)
#   fault  new with a planted fault: every Q row of an item reads query 0's
#          row (items of several queries go wrong), test_cuda_mla only
# Both sides link the same libkvattn.a for everything else (the lead's
# Release sm_90a build of 10:46 on 2026-11-28), so only the wgmma kernels
# differ between them.
# 1. tests (in parallel): new: test_cuda_mla whole, _mla_run and _mla_sparse
#    quick, test_cuda_mla_nan whole; box: test_cuda_mla whole, _mla_run
#    quick, _mla_nan whole; fault: test_cuda_mla quick (must FAIL: its case 5,
#    H 16 q 1-3, has items of several queries);
# 2. rows alternated KVA_ROUNDS (2) times, odd rounds base new box, even
#    rounds box new base; round 1 checks request 0 of new and box against
#    the reference backend:
#    bf16 H 128 q 2 8k B 64 (the issue row: the TMA kernel), bf16 q 1 4k
#    (TMA), bf16 q 1 4k B 16 (the split-key kernel; box = new there), FP8
#    q 1 4k (the alternating FP8 kernel; box = new), bf16 H 16 16k (mma
#    kernel, the same code on every side: the call's noise);
# 3. compute-sanitizer memcheck of each side's test_cuda_mla quick while
#    time is left (KVA_MEMCHECK=0 skips it).
# usage (device): run(command="bash .dev/mla51/ab.sh", carry=[".dev/mla51"],
#                     kind="nvidia-h200", timeout_s=300)
# KVA_SIDES (default "new box"): the sides timed against base.
set -u
o=${OUT:-/tmp/out}
mkdir -p "$o/l"
d=$(cd "$(dirname "$0")" && pwd)
cd "$d"
t0=$(date +%s)
el() { echo $(($(date +%s) - t0)); }
xz -dc bins.tar.xz | tar -x
gpu=$(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | head -1)
echo "gpu: $gpu" | tee "$o/log.txt"
tst() { # side, test, quick
  local q="" rc
  [ "$3" = 1 ] && q="KVA_TEST_QUICK=1"
  env $q timeout 120 bins/$1/$2 >"$o/l/${2}_$1.log" 2>&1
  rc=$?
  echo "$2 $([ "$3" = 1 ] && echo quick || echo whole) ($1) rc=$rc: $(grep -E 'passed|FAILED|CHECK failed' "$o/l/${2}_$1.log" | tail -1 | cut -c1-140)"
}
SIDES=${KVA_SIDES-new box}
(tst new test_cuda_mla 0 & tst new test_cuda_mla_run 1 & tst new test_cuda_mla_sparse 1 &
  tst new test_cuda_mla_nan 0 & tst fault test_cuda_mla 1 &
  if [ -x bins/box/test_cuda_mla ]; then
    tst box test_cuda_mla 0 & tst box test_cuda_mla_run 1 & tst box test_cuda_mla_nan 0 &
  fi
  wait) 2>&1 | tee -a "$o/log.txt"
echo "== tests $(el) s (fault must fail: rc != 0)" | tee -a "$o/log.txt"
ROWS=("bf16 q2 8k|--batch 128 --context 8192 --heads 128 --q-len 2 --block-size 64"
  "bf16 q1 4k|--batch 128 --context 4096 --heads 128 --block-size 64"
  "bf16 q1 4k B16|--batch 128 --context 4096 --heads 128 --block-size 16"
  "fp8 q1 4k|--batch 128 --context 4096 --heads 128 --kv-quant fp8"
  "bf16 H16 16k|--heads 16 --context 16384")
bench1() { # row, sides...
  local m=$1 j chk
  shift
  for v in "$@"; do
    chk=0
    [ $r = 1 ] && [ $v != base ] && chk=1
    j=$(timeout 60 bins/$v/bench_cuda_mla ${m#*|} --iters 30 --check $chk 2>>"$o/l/bench.err" | tail -1)
    echo "r$r ${m%%|*} $v: $(echo "$j" | grep -oE '"ms": [0-9.]+|"check_bad": [-0-9]+' | tr '\n' ' ')"
  done
}
for r in $(seq 1 "${KVA_ROUNDS:-2}"); do
  S="base $SIDES"
  [ $((r % 2)) = 0 ] && S=$(echo $S | tr ' ' '\n' | tac | tr '\n' ' ')
  for m in "${ROWS[@]}"; do bench1 "$m" $S; done
  echo "== round $r $(el) s" >&2
done 2>&1 | tee "$o/bench.txt"
echo "== bench $(el) s" | tee -a "$o/log.txt"
for v in $SIDES; do
  if [ "${KVA_MEMCHECK:-1}" = 1 ] && [ "$(el)" -lt 200 ]; then
    KVA_TEST_QUICK=1 timeout 45 compute-sanitizer --tool memcheck bins/$v/test_cuda_mla >"$o/l/memcheck_$v.log" 2>&1
    echo "memcheck test_cuda_mla quick ($v) rc=$?: $(grep -E 'ERROR SUMMARY' "$o/l/memcheck_$v.log" | tail -1)" | tee -a "$o/log.txt"
  else
    echo "memcheck ($v) skipped at $(el) s" | tee -a "$o/log.txt"
  fi
done
tar -czf "$o/logs.tgz" -C "$o" l && rm -rf "$o/l"
echo "== end $(el) s" | tee -a "$o/log.txt"
echo "== table (ms, median of 30; $gpu)"
cat "$o/log.txt"
sort -s -k2,4 "$o/bench.txt" | grep -E "^r"
