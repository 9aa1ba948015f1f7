#!/usr/bin/env bash
# perf_step.sh - CPU time of one decode step function per kvattn binary,
# for a VM whose other jobs swamp wall-clock timings: each run is sampled
# with perf (cpu-clock, which counts only while the bench runs on a core,
# not while it waits for one) and the samples that land in the step symbol
# are counted. Binaries are rotated round by round as in ab_rows.sh.
# Prints "r<round> <tag> <samples in SYM> <samples in total>".
# Usage: BINS="main=a/kvattn new=b/kvattn" SYM=kva__avx2_steps_i8s_d128 \
#        ISA=avx2 FLAGS="--heads 32 --dtype f16 --kv-quant int8 --layout nhd" \
#        ROUNDS=6 bash dev/lines38/perf_step.sh
set -euo pipefail
read -r -a bins <<<"${BINS:?}"
SYM=${SYM:?} ISA=${ISA:-avx2} ROUNDS=${ROUNDS:-6} ITERS=${ITERS:-20} FREQ=${FREQ:-4000}
FLAGS=${FLAGS:-"--heads 32 --dtype f16 --kv-quant int8 --layout nhd"}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
n=${#bins[@]}
echo "start $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg) sym $SYM isa $ISA flags $FLAGS"
for r in $(seq "$ROUNDS"); do
  for k in $(seq 0 $((n - 1))); do
    b=${bins[$(((k + r - 1) % n))]}
    # shellcheck disable=SC2086
    KVA_CPU_ISA=$ISA perf record -q -e cpu-clock -F "$FREQ" -o "$tmp/p.data" ${b#*=} bench \
      --batch 4 --context 16384 --kv-heads 8 --iters "$ITERS" --no-check --no-ceiling \
      --threads 1 $FLAGS > /dev/null 2>&1
    perf report -i "$tmp/p.data" --stdio -n --sort symbol 2>/dev/null |
      awk -v r="$r" -v t="${b%%=*}" -v s="$SYM" '
        /^#/ || NF < 3 {next} {tot += $2} $4 == s {hit = $2}
        END {printf "r%s %s %d %d\n", r, t, hit, tot}'
  done
done
echo "end $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
