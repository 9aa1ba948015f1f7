#!/usr/bin/env bash
# dev/mla51/restage.sh [BASE_COMMIT]: rebuilds the staged call of dev/mla51/ab.sh on the dev VM
# (no GPU; ~5 min on the 2-core VM, most of it xz): the sides base (BASE_COMMIT, default
# 2d5f8b2, main when mla51 branched), new (branch mla51), box (branch mla51-box) and fault (mla51
# with every Q row of an item read from query 0's row: ml_stage_q's ASYNC row lookup with qi = 0),
# each by dev/mla51/side.sh into build-cu/side_*, then dev/mla51/stage.sh into
# /work/main/.dev/mla51. Needs build-cu configured as side.sh says and build-cu/lib_common.a (a
# Release sm_90a libkvattn.a of main, e.g. the lead's /work/main/build-lead/libkvattn.a).
set -euo pipefail
cd "$(dirname "$0")/../.."
base=${1:-2d5f8b2}
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
for s in base:$base new:mla51 box:mla51-box fault:mla51; do
  mkdir -p "$t/${s%%:*}"
  git archive "${s#*:}" src include | tar -x -C "$t/${s%%:*}"
done
f=$t/fault/src/attn/cuda/mla_decode_common.cuh
sed -i 's|const int32_t qi = ok ? r / w.nh : 0, hh = ok ? r - qi \* w.nh : 0;|const int32_t qi = 0, hh = ok ? r % w.nh : 0; /* FAULT */|' "$f"
grep -q "FAULT" "$f" || { echo "fault not planted"; exit 1; }
for s in base new box fault; do bash dev/mla51/side.sh $s "$t/$s" build-cu | tail -1; done
bash dev/mla51/stage.sh ab.sh base:bench_cuda_mla new \
  box:bench_cuda_mla,test_cuda_mla,test_cuda_mla_run,test_cuda_mla_nan fault:test_cuda_mla
