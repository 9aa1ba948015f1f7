#!/usr/bin/env bash
# perf_rows.sh - the CPU decode rows of dev/lines38/ab_rows.sh measured as
# CPU time inside the chunk-step functions (symbols matching SYM, default
# "_steps_"), for a VM whose other jobs swamp wall-clock timings: each run is
# sampled by perf (cpu-clock counts only while the bench is on a core) and
# the samples in those symbols are summed. Binaries rotate round by round.
# Prints "r<round> <isa> <shape> <tag> <step samples> <all samples>
# <median ms> <min ms>"; summarise with dev/lines38/perf_rows_table.py.
# Usage: BINS="main=a/kvattn new=b/kvattn" ROWS='avx2' ROUNDS=3 \
#        bash dev/lines38/perf_rows.sh
set -euo pipefail
read -r -a bins <<<"${BINS:?}"
ROUNDS=${ROUNDS:-3} ROWS=${ROWS:-.} ITERS=${ITERS:-16} FREQ=${FREQ:-4000} SYM=${SYM:-_steps_}
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
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=${#bins[@]}
echo "start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$ROUNDS"); do
  echo "== round $r $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
  while read -r isa name flags; do
    for k in $(seq 0 $((n - 1))); do
      b=${bins[$(((k + r - 1) % n))]}
      # shellcheck disable=SC2086
      KVA_CPU_ISA=$isa perf record -q -e cpu-clock -F "$FREQ" -o "$tmp/p.data" ${b#*=} bench \
        --batch 4 --context 16384 --kv-heads 8 --iters "$ITERS" --no-check --no-ceiling \
        --threads 1 $flags > "$tmp/out" 2>&1
      perf report -i "$tmp/p.data" --stdio -n --sort symbol 2>/dev/null |
        awk -v s="$SYM" '/^#/ || NF < 4 {next} {tot += $2} $4 ~ s {hit += $2}
          END {printf "%d %d", hit, tot}' > "$tmp/cnt"
      echo "r$r $isa $name ${b%%=*} $(cat "$tmp/cnt") \
$(awk '/attention median/ {print $3, $(NF-1)}' "$tmp/out")"
    done
  done <<<"$shapes"
done
echo "end $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
