#!/usr/bin/env bash
# dev/dcp29/run.sh - dcp29's GPU call (issues 19, 20, 23): main (base/) against the branch (new/) with
# dev/dcp28/ab.sh (2 alternated rounds: --dcp 4 / 2 at 128k R 1 and R 8, decode rows, int8; tests and memcheck
# of the new tree; per-CTA traces), and the trace of mid/ (the branch with the bulk copy alone) beside them.
# From a folder holding base/ new/ [mid/]: OUT=DIR bash new/dev/dcp29/run.sh
set -u
OUT=${OUT:-out}; mkdir -p $OUT
TT="base new"; [ -d mid ] && TT="base mid new"
KVA_COPIES2=0 KVA_R8_NS="${KVA_R8_NS:-4 2}" KVA_TRACE_TREES="$TT" bash new/dev/dcp28/ab.sh base new > $OUT/ab.txt 2>&1
echo "ab.sh rc=$?"
# The give-back path of the spread merge: the new tree's tests again with helpers that give their slice back at
# once unless the last count is already in (DM_SPREAD_NS 0), rebuilt in ab.sh's build of the new tree.
if [ "${KVA_GIVEBACK:-1}" = 1 ]; then
  sed -i 's/^#define DM_SPREAD_NS 20000$/#define DM_SPREAD_NS 0/' new/src/attn/cuda/decode_mma_kernel.cuh
  grep -c "DM_SPREAD_NS 0$" new/src/attn/cuda/decode_mma_kernel.cuh
  timeout 200 ninja -C /tmp/dcp28n -j16 test_cuda_attn test_cuda_quant_attn > $OUT/l/gb_build.log 2>&1; echo "giveback build rc=$?"
  for g in test_grid,test_decode_mma test_split_kv,test_many_items,test_mma_mixed; do
    ( KVA_TEST_ONLY=$g KVA_TEST_QUICK=1 timeout 120 /tmp/dcp28n/test_cuda_attn > $OUT/l/gb_$g.log 2>&1; echo "giveback test_cuda_attn[$g] rc=$?: $(grep -aE 'passed|FAILED|CHECK failed' $OUT/l/gb_$g.log | tail -1 | cut -c1-100)" ) &
  done
  ( KVA_TEST_QUICK=1 timeout 120 /tmp/dcp28n/test_cuda_quant_attn > $OUT/l/gb_q.log 2>&1; echo "giveback test_cuda_quant_attn rc=$?: $(grep -aE 'passed|FAILED|CHECK failed' $OUT/l/gb_q.log | tail -1 | cut -c1-100)" ) &
  wait
fi 2>&1 | tee $OUT/giveback.txt
tar -czf $OUT/logs.tgz -C $OUT l 2>/dev/null && rm -rf $OUT/l
grep -a "1x32768 dm_trace per call 1: \(event\|landed\|cta loop end\|counted\|end \)" $OUT/trace.txt | cut -c1-150
for t in base mid new; do grep -a "^$t 1x32768 dm_trace per call 1: merge cta" $OUT/trace.txt | head -8 | cut -c1-200; done
grep -a "^new 1x32768 dm_trace per call 1: help cta" $OUT/trace.txt | head -12 | cut -c1-200
cat $OUT/tests.txt $OUT/giveback.txt
echo "== summary"; sed 's/ median / /; s/ back to back / b2b /' $OUT/sum.txt | cut -c1-200
