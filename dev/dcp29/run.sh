#!/usr/bin/env bash
# dev/dcp29/run.sh - dcp29's GPU call (issues 19, 20, 23): main (base/) against the branch (new/) with
# dev/dcp28/ab.sh (2 alternated rounds: --dcp 4 / 2 at 128k R 1 and R 8, decode rows, int8; tests and memcheck
# of the new tree; per-CTA traces), and the trace of mid/ (the branch with the bulk copy alone) beside them.
# From a folder holding base/ new/ [mid/]: OUT=DIR bash new/dev/dcp29/run.sh
set -u
OUT=${OUT:-out}; mkdir -p $OUT
TT="base new"; [ -d mid ] && TT="base mid new"
KVA_COPIES2=0 KVA_R8_NS="4 2" KVA_TRACE_TREES="$TT" bash new/dev/dcp28/ab.sh base new > $OUT/ab.txt 2>&1
echo "ab.sh rc=$?"
tar -czf $OUT/logs.tgz -C $OUT l 2>/dev/null && rm -rf $OUT/l
grep -a "1x32768 dm_trace per call 1: \(event\|landed\|cta loop end\|counted\|end \)" $OUT/trace.txt | cut -c1-150
for t in base mid new; do grep -a "^$t 1x32768 dm_trace per call 1: merge cta" $OUT/trace.txt | head -8 | cut -c1-200; done
grep -a "^new 1x32768 dm_trace per call 1: help cta" $OUT/trace.txt | head -12 | cut -c1-200
cat $OUT/tests.txt
echo "== summary"; sed 's/ median / /; s/ back to back / b2b /' $OUT/sum.txt | cut -c1-200
