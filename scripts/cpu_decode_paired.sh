#!/usr/bin/env bash
# cpu_decode_paired.sh - the CPU decode measurements of bench/results/2026-11-22_performance-journal.md
# ("CPU decode against the read bandwidth, paired"): bench/paged_read's
# random-piece read rates, then ROUNDS rounds of `kvattn bench --paired` over
# layouts, block sizes, GQA ratios and cache formats (BATCH x 16k, D 128, Hkv 8).
# Needs a Release build in build/ (bash scripts/test.sh or cmake + ninja).
# Knobs (environment): ROUNDS (3), THREADS (2: the multi-threaded shapes'
# threads), BATCH (4 requests), K (the kvattn binary, build/kvattn), and
# SET=target for only issue 23's CPU target shapes (f16 and int8, GQA 1 and 4,
# NHD, B 16; no paged_read, no ceilings): e.g. on the GPU machine's 16-core
# host
#   SET=target THREADS=16 BATCH=16 ROUNDS=3 bash scripts/cpu_decode_paired.sh
# How a shape is paired: `kvattn bench --paired` follows each of its timed
# runs with one pass of the same threads over a 256 MiB buffer (summing
# 64-bit words) and reports the median over the runs of (KV bytes / run
# time) / (that pass's GB/s); the read rate shown is the passes' median.
set -euo pipefail
cd "$(dirname "$0")/.."
K=${K:-build/kvattn}
P=build/paged_read
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
BATCH=${BATCH:-4}
SET=${SET:-all}
t=$THREADS
# The target shapes report only the paired fraction: no ceilings measured.
NC=
[ "$SET" = target ] && NC=--no-ceiling
echo "start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$SET" != target ]; then
  echo "== paged_read (threads, piece bytes, prefetch distance)"
  for r in 1 2; do
    for c in "1 1073741824 0" "1 4096 0" "1 4096 4" "1 32768 0" "1 32768 2" \
      "2 536870912 0" "2 4096 4" "2 32768 2"; do
      # shellcheck disable=SC2086
      echo "r$r $($P $c)"
    done
  done
fi
run() { # tag, bench flags...
  local tag=$1 out
  shift
  out=$($K bench --batch "$BATCH" --context 16384 --kv-heads 8 --iters 16 --no-check --paired $NC "$@" 2>&1)
  echo "$tag $(echo "$out" | awk '/attention median/ {print $3, $4}'); paired" \
    "$(echo "$out" | awk '/paired read/ {print $3, "of read passes", $(NF-1), "GB/s"}')"
}
for r in $(seq "$ROUNDS"); do
  echo "== round $r $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
  if [ "$SET" = target ]; then
    for H in 8 32; do
      run "r$r f16 GQA$((H / 8)) t$t nhd B16" --heads $H --dtype f16 --threads "$t"
      run "r$r int8 GQA$((H / 8)) t$t nhd B16" --heads $H --dtype f16 --kv-quant int8 --threads "$t"
    done
    continue
  fi
  for L in nhd hnd; do
    for B in 16 64; do
      run "r$r f16 GQA1 t$t $L B$B" --heads 8 --dtype f16 --threads "$t" --layout $L --block-size $B
    done
  done
  run "r$r f16 GQA1 t1 nhd B16" --heads 8 --dtype f16 --threads 1
  run "r$r f16 GQA1 t1 hnd B16" --heads 8 --dtype f16 --threads 1 --layout hnd
  for H in 32 64; do
    for L in nhd hnd; do
      run "r$r f16 GQA$((H / 8)) t$t $L B16" --heads $H --dtype f16 --threads "$t" --layout $L
    done
  done
  for H in 8 32; do
    for q in int8 fp8; do
      run "r$r $q GQA$((H / 8)) t$t nhd B16" --heads $H --dtype f16 --kv-quant $q --threads "$t"
    done
  done
  run "r$r f32 GQA8 t$t nhd B16" --heads 64 --dtype f32 --threads "$t"
  run "r$r bf16 GQA8 t$t nhd B16" --heads 64 --dtype bf16 --threads "$t"
done
echo "end $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
