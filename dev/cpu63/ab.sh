#!/usr/bin/env bash
# ab.sh - cpu63: base vs new build of the CPU decode, same kernel (--variant,
# decode_avx512bf16 by default: VNNI int8 scores, and in new the VNNI int8
# P.V), same shapes, alternated: each round runs every shape on both builds
# back to back, their order flipped every round. Each run is `kvattn bench
# --paired` (the time and the fraction of a read pass of the same moment).
# The table last: per shape the medians over rounds of the time and of the
# paired read fraction, and the median of the per-round ratios new / base
# (< 1: new faster).
# Knobs (environment): KB, KN (base and new kvattn binaries), THREADS (2),
# ROUNDS (3), VARIANT (decode_avx512bf16), CONTEXT (16384), ITERS (16),
# SHAPES ("batch:format:gqa ..."; format int8, int8-token, f16, ...; Hkv 8,
# D 128), DEADLINE (epoch seconds: no shape starts after it).
# Usage: KB=/work/main/build-cpu/kvattn KN=build/kvattn bash dev/cpu63/ab.sh
set -uo pipefail
KB=${KB:?base kvattn}
KN=${KN:?new kvattn}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-3}
VARIANT=${VARIANT:-decode_avx512bf16}
CONTEXT=${CONTEXT:-16384}
ITERS=${ITERS:-16}
SHAPES=${SHAPES:-"4:int8:4 4:int8-token:4 4:int8:1 4:int8:8 1:int8:4 4:f16:4"}
DEADLINE=${DEADLINE:-0}
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
one() { # binary batch format gqa -> "ms paired%"
  local fl=(--dtype f16 --kv-quant none)
  case $3 in
    f16) ;;
    bf16) fl=(--dtype bf16 --kv-quant none) ;;
    *) fl=(--dtype f16 --kv-quant "$3") ;;
  esac
  "$1" bench --batch "$2" --context "$CONTEXT" --kv-heads 8 --heads $((8 * $4)) "${fl[@]}" \
    --threads "$THREADS" --iters "$ITERS" --no-check --paired --no-ceiling --variant "$VARIANT" 2>&1 |
    awk '/attention median/ {t = $3; u = $4} /paired read/ {p = $3}
         END {if (u == "us") t /= 1000; sub("%", "", p); printf "%.4f %s\n", t, p}'
}
late() { [ "$DEADLINE" -gt 0 ] && [ "$(date +%s)" -ge "$DEADLINE" ]; }
for r in $(seq "$ROUNDS"); do
  late && { echo "== deadline: stopped before round $r"; break; }
  echo "== round $r $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
  if [ $((r % 2)) = 1 ]; then order="base new"; else order="new base"; fi
  for sh in $SHAPES; do
    IFS=: read -r b f g <<< "$sh"
    for w in $order; do
      late && break
      if [ "$w" = base ]; then k=$KB; else k=$KN; fi
      line="r$r b$b $f GQA$g t$THREADS $w $(one "$k" "$b" "$f" "$g")"
      echo "$line" | tee -a "$raw"
    done
  done
done
echo "== end $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== medians over (up to) $ROUNDS rounds: $CONTEXT keys per request, $THREADS threads, $VARIANT, Hkv 8, D 128, NHD B 16;"
echo "   ms = attention median per round; paired = % of the read pass of the same moment;"
echo "   ratio = median over rounds of (new ms / base ms), < 1: new faster"
awk '
function med(s,   n, v, i, j, x) { n = split(s, v, " ")
  for (i = 2; i <= n; i++) { x = v[i] + 0; for (j = i - 1; j >= 1 && v[j] + 0 > x; j--) v[j + 1] = v[j]; v[j + 1] = x }
  return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }
{ key = $2 " " $3 " " $4 " " $5; if (!(key in seen)) { seen[key] = 1; keys[++nk] = key }
  ms[key, $6] = ms[key, $6] " " $7; pr[key, $6] = pr[key, $6] " " $8; t[$1, key, $6] = $7 }
END {
  printf "%-4s %-10s %-5s %-4s | %9s %9s | %7s | %7s %7s | %s\n", "B", "format", "GQA", "thr",
    "base", "new", "ratio", "pbase%", "pnew%", "per-round ratios"
  for (i = 1; i <= nk; i++) { key = keys[i]; rs = ""; rl = ""
    for (r = 1; r <= 99; r++) if (("r" r, key, "base") in t && ("r" r, key, "new") in t && t["r" r, key, "base"] > 0) {
      x = t["r" r, key, "new"] / t["r" r, key, "base"]; rs = rs " " x; rl = rl sprintf(" %.3f", x) }
    split(key, kk, " ")
    printf "%-4s %-10s %-5s %-4s | %9.3f %9.3f | %7.3f | %7.1f %7.1f |%s\n", kk[1], kk[2], kk[3], kk[4],
      med(ms[key, "base"]), med(ms[key, "new"]), med(rs), med(pr[key, "base"]), med(pr[key, "new"]), rl }
}' "$raw"
