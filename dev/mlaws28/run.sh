#!/usr/bin/env bash
# dev/mlaws28/run.sh - one device call for the alternating-tile MLA wgmma body:
# from a folder holding base/ (main) and new/ (this branch) trees, run
# bench/mla_ab_cuda.sh of new/ (build, quick MLA tests, base/new alternated
# KVA_ROUNDS times over the dense bf16 + fp8 rows and the sparse decode row,
# the sparse suite once per side), then memcheck of test_cuda_mla quick.
#   usage (device, repo root): cd .dev/mlaws28 && OUT=$OUT bash new/dev/mlaws28/run.sh
set -u
o=${OUT:-/tmp/out}
mkdir -p "$o"
(cd new && BASE=../base OUT="$o" KVA_STEPS="${KVA_STEPS:-test bench suite}" bash bench/mla_ab_cuda.sh) 2>&1 |
  tee "$o/ab.txt"
if [ -x new/b/test_cuda_mla ] && [ "${KVA_MEMCHECK:-1}" = 1 ]; then
  KVA_TEST_QUICK=1 timeout "${KVA_MEMCHECK_S:-150}" compute-sanitizer --tool memcheck \
    new/b/test_cuda_mla >"$o/memcheck.txt" 2>&1
  echo "memcheck test_cuda_mla quick rc=$?: $(grep -E 'ERROR SUMMARY' "$o/memcheck.txt" | tail -1)" |
    tee -a "$o/ab.txt"
fi
