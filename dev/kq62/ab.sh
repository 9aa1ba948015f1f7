#!/usr/bin/env bash
# ab.sh - kq62: the int8 decode of two builds (base, new) at both AVX-512
# levels, forced by --variant (decode_avx512: fp32 key scores, the same code
# in both builds, a control; decode_avx512bf16: VNNI key scores, whose per-item
# query digits kq62 changed). Per round, per shape: the 4 runs (2 builds x 2
# levels) back to back, their order reversed every other round. The table
# last (twice: over each run's attention median, then over its minimum, which
# a loaded 2-core VM disturbs less): per shape the medians over rounds, the
# median of the per-round ratios new / base at each level (< 1: new faster),
# and new's level ratio avx512 / avx512bf16 (< 1: the AVX-512 level faster).
# Knobs (environment): BASE, NEW (kvattn binaries), THREADS (2), ROUNDS (3),
# SHAPES ("batch:context:gqa ..."), FORMATS ("int8 int8-token"), ITERS_SHORT
# (200, context <= 4096), ITERS_LONG (16), DEADLINE (epoch s; 0: none).
# Usage: BASE=/tmp/base_kvattn NEW=build/kvattn ROUNDS=3 bash dev/kq62/ab.sh
set -uo pipefail
BASE=${BASE:?kvattn binary of base}
NEW=${NEW:?kvattn binary of new}
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-3}
SHAPES=${SHAPES:-"1:1024:1 1:1024:4 1:1024:8 16:1024:4 16:1024:8 4:16384:1 4:16384:4 4:16384:8"}
FORMATS=${FORMATS:-"int8 int8-token"}
ITERS_SHORT=${ITERS_SHORT:-200}
ITERS_LONG=${ITERS_LONG:-16}
DEADLINE=${DEADLINE:-0}
raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
one() { # binary batch context gqa format kernel -> "median_ms min_ms"
  local it=$ITERS_LONG
  [ "$3" -le 4096 ] && it=$ITERS_SHORT
  "$1" bench --batch "$2" --context "$3" --kv-heads 8 --heads $((8 * $4)) --dtype f16 \
    --kv-quant "$5" --threads "$THREADS" --iters "$it" --no-check --no-ceiling --variant "$6" 2>&1 |
    awk '/attention median/ {t = $3; u = $4; m = $(NF-1); v = $NF}
         END {if (u == "us") t /= 1000; if (v == "us") m /= 1000; printf "%.4f %.4f\n", t, m}'
}
late() { [ "$DEADLINE" -gt 0 ] && [ "$(date +%s)" -ge "$DEADLINE" ]; }
runs="base:decode_avx512 new:decode_avx512 base:decode_avx512bf16 new:decode_avx512bf16"
for r in $(seq "$ROUNDS"); do
  late && { echo "== deadline: stopped before round $r"; break; }
  echo "== round $r $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
  order=$runs
  [ $((r % 2)) = 0 ] && order=$(echo "$runs" | tr ' ' '\n' | tac | tr '\n' ' ')
  for sh in $SHAPES; do
    IFS=: read -r b c g <<< "$sh"
    for f in $FORMATS; do
      for x in $order; do
        late && break
        w=${x%%:*} k=${x#*:}
        bin=$BASE
        [ "$w" = new ] && bin=$NEW
        echo "r$r b${b}x$c $f GQA$g $w $k $(one "$bin" "$b" "$c" "$g" "$f" "$k")" | tee -a "$raw"
      done
    done
  done
done
echo "== end $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== medians over (up to) $ROUNDS rounds, $THREADS threads, Hkv 8, D 128, f16 q; ms = attention median (or min);"
echo "   n/b = median over rounds of new ms / base ms at that level (< 1: new faster);"
echo "   lvl = median over rounds of new's avx512 ms / avx512bf16 ms (< 1: the AVX-512 level faster)"
table() { # column of the raw lines (7: medians, 8: minima)
awk -v col="$1" '
function med(s,   n, v, i, j, x) { n = split(s, v, " ")
  for (i = 2; i <= n; i++) { x = v[i] + 0; for (j = i - 1; j >= 1 && v[j] + 0 > x; j--) v[j + 1] = v[j]; v[j + 1] = x }
  return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }
{ key = $2 " " $3 " " $4; if (!(key in seen)) { seen[key] = 1; keys[++nk] = key }
  run = $5 ":" $6; ms[key, run] = ms[key, run] " " $col; t[$1, key, run] = $col; rr[$1] = 1 }
function ratios(key, a, b,   r, s) { s = ""
  for (r in rr) if ((r, key, a) in t && (r, key, b) in t && t[r, key, b] > 0) s = s " " t[r, key, a] / t[r, key, b]
  return s }
END {
  printf "%-10s %-10s %-5s | %8s %8s %6s | %8s %8s %6s | %6s %6s\n", "shape", "format", "GQA",
    "512 base", "512 new", "n/b", "bf16 bas", "bf16 new", "n/b", "lvl b", "lvl n"
  for (i = 1; i <= nk; i++) { key = keys[i]; split(key, kk, " ")
    printf "%-10s %-10s %-5s | %8.3f %8.3f %6.3f | %8.3f %8.3f %6.3f | %6.3f %6.3f\n", kk[1], kk[2], kk[3],
      med(ms[key, "base:decode_avx512"]), med(ms[key, "new:decode_avx512"]),
      med(ratios(key, "new:decode_avx512", "base:decode_avx512")),
      med(ms[key, "base:decode_avx512bf16"]), med(ms[key, "new:decode_avx512bf16"]),
      med(ratios(key, "new:decode_avx512bf16", "base:decode_avx512bf16")),
      med(ratios(key, "base:decode_avx512", "base:decode_avx512bf16")),
      med(ratios(key, "new:decode_avx512", "new:decode_avx512bf16")) }
}' "$raw"
}
echo "== over the attention medians"
table 7
echo "== over the attention minima"
table 8
