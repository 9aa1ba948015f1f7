#!/usr/bin/env bash
# levels.sh - cpu51: the CPU decode's two AVX-512 levels side by side, for the
# formats whose decode they run differently or the same. The two kernels share
# every chunk step (decode_avx512.c: the same pair_steps); decode_avx512bf16
# adds (a) VNNI int8 key scores (kq: INT8_CHANNEL / INT8_TOKEN_K keys, CPUs
# with AVX512_VNNI) and (b) vdpbf16ps scores for bf16 q and cache. So int8 and
# int8-token rows compare VNNI against fp32 key scores, the fp8 and f16 rows
# run identical code on both (a control: their ratio is the noise), and the
# bf16 row (if asked) compares vdpbf16ps against fp32 scores.
# Each shape: `kvattn bench --paired` with the kernel forced by --variant
# (kva__context_force_kernel), both levels back to back, their order flipped
# every round; the table last: per shape the medians over rounds of the time
# and of the paired read fraction, and the median of the per-round time ratios
# avx512 / avx512bf16 (< 1: the AVX-512 level is faster).
# Knobs (environment): K (kvattn binary, build/kvattn), THREADS (2), ROUNDS (3),
# BATCHES ("1 4": requests of CONTEXT keys), CONTEXT (16384), GQAS ("1 4 8";
# Hkv 8, D 128), FORMATS ("int8 int8-token fp8 f16"; also bf16), ITERS (16),
# DEADLINE (epoch seconds: no shape starts after it; the table then shows the
# rounds measured so far, ratios only where both levels ran).
# Usage: K=build-cpu/kvattn THREADS=2 ROUNDS=3 bash dev/cpu51/levels.sh
set -uo pipefail
K=${K:-build/kvattn}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-3}
BATCHES=${BATCHES:-"1 4"}
CONTEXT=${CONTEXT:-16384}
GQAS=${GQAS:-"1 4 8"}
FORMATS=${FORMATS:-"int8 int8-token fp8 f16"}
ITERS=${ITERS:-16}
DEADLINE=${DEADLINE:-0}
A=decode_avx512
B=decode_avx512bf16
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
one() { # batch format gqa kernel -> "ms paired% readGB/s"
  local fl=(--dtype f16 --kv-quant none)
  case $2 in
    f16) ;;
    bf16) fl=(--dtype bf16 --kv-quant none) ;;
    *) fl=(--dtype f16 --kv-quant "$2") ;;
  esac
  "$K" bench --batch "$1" --context "$CONTEXT" --kv-heads 8 --heads $((8 * $3)) "${fl[@]}" \
    --threads "$THREADS" --iters "$ITERS" --no-check --paired --no-ceiling --variant "$4" 2>&1 |
    awk '/attention median/ {t = $3; u = $4} /paired read/ {p = $3; g = $(NF-1)}
         END {if (u == "us") t /= 1000; sub("%", "", p); printf "%.4f %s %s\n", t, p, g}'
}
late() { [ "$DEADLINE" -gt 0 ] && [ "$(date +%s)" -ge "$DEADLINE" ]; }
for r in $(seq "$ROUNDS"); do
  late && { echo "== deadline: stopped before round $r"; break; }
  echo "== round $r $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
  if [ $((r % 2)) = 1 ]; then order="$A $B"; else order="$B $A"; fi
  for b in $BATCHES; do
    for f in $FORMATS; do
      for g in $GQAS; do
        for k in $order; do
          late && break
          line="r$r b$b $f GQA$g t$THREADS $k $(one "$b" "$f" "$g" "$k")"
          echo "$line" | tee -a "$raw"
        done
      done
    done
  done
done
echo "== end $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== medians over (up to) $ROUNDS rounds: ${CONTEXT} keys per request, $THREADS threads, Hkv 8, D 128, NHD B 16;"
echo "   ms = attention median per round; paired = % of the read pass of the same moment;"
echo "   ratio = median over rounds of (avx512 ms / avx512bf16 ms), < 1: the AVX-512 level faster"
awk -v A="$A" -v B="$B" '
function med(s,   n, v, i, j, x) { n = split(s, v, " ")
  for (i = 2; i <= n; i++) { x = v[i] + 0; for (j = i - 1; j >= 1 && v[j] + 0 > x; j--) v[j + 1] = v[j]; v[j + 1] = x }
  return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }
{ key = $2 " " $3 " " $4 " " $5; if (!(key in seen)) { seen[key] = 1; keys[++nk] = key }
  ms[key, $6] = ms[key, $6] " " $7; pr[key, $6] = pr[key, $6] " " $8; t[$1, key, $6] = $7 }
END {
  printf "%-4s %-10s %-5s %-4s | %9s %9s | %7s | %7s %7s | %s\n", "B", "format", "GQA", "thr",
    "avx512", "bf16lvl", "ratio", "p512%", "pbf16%", "per-round ratios"
  for (i = 1; i <= nk; i++) { key = keys[i]; rs = ""; rl = ""
    for (r = 1; r <= 99; r++) if (("r" r, key, A) in t && ("r" r, key, B) in t && t["r" r, key, B] > 0) {
      x = t["r" r, key, A] / t["r" r, key, B]; rs = rs " " x; rl = rl sprintf(" %.3f", x) }
    split(key, kk, " ")
    printf "%-4s %-10s %-5s %-4s | %9.3f %9.3f | %7.3f | %7.1f %7.1f |%s\n", kk[1], kk[2], kk[3], kk[4],
      med(ms[key, A]), med(ms[key, B]), med(rs), med(pr[key, A]), med(pr[key, B]), rl }
}' "$raw"
