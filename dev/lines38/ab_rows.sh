#!/usr/bin/env bash
# ab_rows.sh - dev/lines37/ab_rows.sh (CPU decode rows, several kvattn
# binaries rotated round by round, one thread) with the fastest iteration
# next to the median: on the shared VM a run is often slowed by the other
# jobs for part of its iterations, and the minimum is the iteration least
# disturbed. Prints "r<round> <isa> <shape> <tag> <median-ms> <min-ms>
# <paired>"; summarise with dev/lines38/ab_table.py.
# Usage: BINS="main=a/kvattn new=b/kvattn" ROWS='avx2 int8' ROUNDS=8 \
#        bash dev/lines38/ab_rows.sh | python3 dev/lines38/ab_table.py
set -euo pipefail
read -r -a bins <<<"${BINS:?}"
ROUNDS=${ROUNDS:-6}
ROWS=${ROWS:-.}
ITERS=${ITERS:-12}
shapes=$(grep -E "$ROWS" <<'SHAPES'
avx512bf16 f16_GQA1_nhd --heads 8 --dtype f16 --layout nhd
avx512bf16 f16_GQA1_hnd --heads 8 --dtype f16 --layout hnd
avx512bf16 f16_GQA4_nhd --heads 32 --dtype f16 --layout nhd
avx512bf16 f16_GQA4_hnd --heads 32 --dtype f16 --layout hnd
avx512bf16 f16_GQA8_nhd --heads 64 --dtype f16 --layout nhd
avx512bf16 f16_GQA8_hnd --heads 64 --dtype f16 --layout hnd
avx512bf16 int8_GQA4_nhd --heads 32 --dtype f16 --kv-quant int8 --layout nhd
avx512bf16 fp8_GQA4_nhd --heads 32 --dtype f16 --kv-quant fp8 --layout nhd
avx512bf16 bf16_GQA4_nhd --heads 32 --dtype bf16 --layout nhd
avx2 f16_GQA1_nhd --heads 8 --dtype f16 --layout nhd
avx2 f16_GQA1_hnd --heads 8 --dtype f16 --layout hnd
avx2 f16_GQA4_nhd --heads 32 --dtype f16 --layout nhd
avx2 f16_GQA4_hnd --heads 32 --dtype f16 --layout hnd
avx2 f16_GQA8_nhd --heads 64 --dtype f16 --layout nhd
avx2 f16_GQA8_hnd --heads 64 --dtype f16 --layout hnd
avx2 int8_GQA4_nhd --heads 32 --dtype f16 --kv-quant int8 --layout nhd
avx2 fp8_GQA4_nhd --heads 32 --dtype f16 --kv-quant fp8 --layout nhd
avx2 bf16_GQA4_nhd --heads 32 --dtype bf16 --layout nhd
SHAPES
)
n=${#bins[@]}
echo "start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$ROUNDS"); do
  echo "== round $r $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
  while read -r isa name flags; do
    for k in $(seq 0 $((n - 1))); do
      b=${bins[$(((k + r - 1) % n))]}
      # shellcheck disable=SC2086
      out=$(KVA_CPU_ISA=$isa ${b#*=} bench --batch 4 --context 16384 --kv-heads 8 --iters "$ITERS" \
        --no-check --paired --no-ceiling --threads 1 $flags 2>&1)
      echo "r$r $isa $name ${b%%=*} $(awk '/attention median/ {print $3, $(NF-1)}' <<<"$out") \
$(awk '/paired read/ {print $3}' <<<"$out")"
    done
  done <<<"$shapes"
done
echo "end $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
