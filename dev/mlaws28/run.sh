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
# SASS spill count of the wgmma objects, then Nsight Compute of one launch of
# the H 128 q 1 4k bf16 row on each side (KVA_NCU=0 skips it).
for f in mla_decode_wgmma mla_sparse_wgmma; do
  obj=$(find new/bd -name "$f.cu.o" | head -1)
  [ -n "$obj" ] && echo "sass $f: $(cuobjdump -sass "$obj" | grep -c HGMMA) HGMMA, $(cuobjdump -sass "$obj" | grep -cE 'STL|LDL') LDL/STL" | tee -a "$o/ab.txt"
done
if [ "${KVA_NCU:-1}" = 1 ]; then
  for v in base mine; do
    s=""; [ $v = base ] && s=_base
    timeout 100 ncu --section SpeedOfLight --section SchedulerStats --section WarpStateStats \
      --section MemoryWorkloadAnalysis -k regex:mla_wgmma --launch-skip 2 --launch-count 1 \
      new/b/bench_cuda_mla$s --batch 128 --context 4096 --heads 128 --iters 3 --check 0 \
      >"$o/ncu_$v.txt" 2>&1
    echo "== ncu $v rc=$?" | tee -a "$o/ab.txt"
    grep -E "Duration|Compute \(SM\) Thr|Memory Thr|Issued Warp|No Eligible|Eligible Warps|Active Warps Per|Warp Cycles Per Issued|L2 Hit|Mem Busy|Max Bandwidth|Stall" "$o/ncu_$v.txt" | tr -s ' ' | head -24 | tee -a "$o/ab.txt"
  done
fi
