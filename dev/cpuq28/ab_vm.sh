#!/usr/bin/env bash
# ab_vm.sh - alternated A/B of `kvattn bench --paired` decode rows between two
# kvattn binaries (A, B), for the noisy dev VM: ROUNDS rounds of A then B per
# shape and thread count; prints median and min ms and the paired fraction.
# Usage: A=path/kvattn B=path/kvattn [ROUNDS=3 BATCH=4 THREADS="1 2"
#        SHAPES="int8:32 f16:32 int8:8"] bash dev/cpuq28/ab_vm.sh
set -euo pipefail
ROUNDS=${ROUNDS:-3}
BATCH=${BATCH:-4}
THREADS=${THREADS:-"1 2"}
SHAPES=${SHAPES:-"int8:32 f16:32 int8:8"}
one() { # binary, quant, heads, threads
  local q=()
  [ "$2" = f16 ] || q=(--kv-quant "$2")
  "$1" bench --batch "$BATCH" --context 16384 --kv-heads 8 --iters 16 --no-check --paired \
    --heads "$3" --dtype f16 "${q[@]}" --threads "$4" 2>&1 |
    awk '/attention median/ {m = $3; n = $(NF-1)} /paired read/ {p = $3} END {print m, "ms (min", n, "ms) paired", p}'
}
echo "start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$ROUNDS"); do
  for s in $SHAPES; do
    for t in $THREADS; do
      for ab in A B; do
        echo "r$r $ab ${s%%:*} GQA$((${s##*:} / 8)) t$t $(one "${!ab}" "${s%%:*}" "${s##*:}" "$t")"
      done
    done
  done
done
echo "end $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
