#!/bin/bash
# dev/mlacpu29/chunk_bench.sh [TREE] [R N]: extract the bf16 chunk functions of TREE's
# src/attn/cpu/mla_bf16dot.inc (default: this worktree) and run chunk_bench.c on them.
set -e
here=$(cd "$(dirname "$0")" && pwd); tree=${1:-$here/../..}; shift || true
tmp=$(mktemp -d)
sed -n '/^static inline uint32_t mla_bf16_rne/,/^static const uint32_t mla_bf16_zero_row/p' \
  "$tree/src/attn/cpu/mla_bf16dot.inc" > "$tmp/chunk_body.inc"
[ -n "$CB_SED" ] && sed -i "$CB_SED" "$tmp/chunk_body.inc"
def=; grep -q mla_bf16_o_order "$tmp/chunk_body.inc" && def=-DNEW_PV
grep -q "int32_t row, int32_t Mp," "$tmp/chunk_body.inc" && def="$def -DQW_MP"
gcc $def -O3 -std=gnu11 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c -mavx2 -mavx512bf16 -I"$tmp" \
  -Wno-unused-function "$here/chunk_bench.c" -o "$tmp/cb" -lm
"$tmp/cb" "$@"
rm -rf "$tmp"
