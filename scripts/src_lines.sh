#!/usr/bin/env bash
# src_lines.sh - issue 15's size count of src/attn: all lines (wc -l) of the
# files git tracks under src/attn, and the same without the files that serve
# only features that came after the issue was filed (at 418b0c7: 13,768 lines
# in 50 files, goal <= 3/4 of that = 10,326). A file counts as "later" when its
# name says it serves only one of: MLA (mla_*, ref_mla*, cache_ds_mla.cu,
# prefill_wgmma_d192.cu: the D 192 / Dv 128 trait of MLA's prefill), sparse
# MLA (*_sparse*), the indexer of sparse MLA (indexer*,
# index_cache.cu, ref_indexer.c), cascade (cascade.*), DCP (dcp_*) and tree
# masks (tree_mask*). Shared files that grew to serve those features count in
# full.
# Usage: bash scripts/src_lines.sh [REV] [--files]
#   REV      count the tree of that revision (default: the working tree, tracked
#            and untracked-but-not-ignored files)
#   --files  also print every file's count and its class
set -euo pipefail
cd "$(dirname "$0")/.."
rev=
files=0
for a in "$@"; do
  case "$a" in
    --files) files=1 ;;
    -h | --help)
      sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'
      exit 0
      ;;
    *) rev=$a ;;
  esac
done

# Prints the reason a path serves only a later feature, or nothing.
later() {
  case "${1##*/}" in
    *_sparse*) echo "sparse MLA" ;;
    mla_* | ref_mla* | cache_ds_mla.cu | prefill_wgmma_d192.cu) echo "MLA" ;;
    indexer* | index_cache.cu | ref_indexer.c) echo "indexer" ;;
    cascade.*) echo "cascade" ;;
    dcp_*) echo "DCP" ;;
    tree_mask*) echo "trees" ;;
  esac
}

# "lines path" of every file.
count() {
  if [ -n "$rev" ]; then
    git ls-tree -r --name-only "$rev" src/attn | while read -r f; do
      echo "$(git show "$rev:$f" | wc -l) $f"
    done
  else
    git ls-files -co --exclude-standard src/attn | while read -r f; do
      [ -f "$f" ] && echo "$(wc -l < "$f") $f"
    done
  fi
}

all=0 nall=0 kept=0 nkept=0
declare -A by_reason=() n_reason=()
while read -r n f; do
  r=$(later "$f")
  all=$((all + n)) nall=$((nall + 1))
  if [ -z "$r" ]; then
    kept=$((kept + n)) nkept=$((nkept + 1))
  else
    by_reason[$r]=$((${by_reason[$r]:-0} + n))
    n_reason[$r]=$((${n_reason[$r]:-0} + 1))
  fi
  [ "$files" = 1 ] && printf '%6d  %-12s %s\n' "$n" "${r:-counted}" "$f"
done < <(count | sort -k2)

echo "src/attn${rev:+ at $rev}: $all lines in $nall files"
for r in "MLA" "sparse MLA" "indexer" "cascade" "DCP" "trees"; do
  [ -n "${by_reason[$r]:-}" ] &&
    printf '  later, %-10s %6d lines in %d file(s)\n' "$r:" "${by_reason[$r]}" "${n_reason[$r]}"
done
echo "issue 15 count: $kept lines in $nkept files (at 418b0c7: 13768; goal <= 10326)"
