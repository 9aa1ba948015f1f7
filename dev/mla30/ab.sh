#!/usr/bin/env bash
# dev/mla30/ab.sh - one device call for the two-piece tile copies of the
# 16-bit dense MLA wgmma decode (issue 16; mla29's ca27a60 on main): from a
# folder holding base/ (main) and new/ (branch mla30), builds new/ and links
# base's MLA kernels beside it (bench/mla_ab_cuda.sh), runs the MLA tests quick,
# the dense rows H 16 16k, H 128 q 1 4k / q 2 8k in bf16 and FP8 and the sparse
# decode row, base and new alternated KVA_ROUNDS (2) times, then memcheck of
# test_cuda_mla quick. Raw logs in $OUT/ab/logs.tgz, the table last.
# new/ must be a tree at commit 6a44430 (the two-piece copies with this script;
# the branch head went back to main's loop), e.g.
#   git archive --prefix=new/ 6a44430 | tar -x -C /work/main/.dev/mla30
#   usage (device): cd .dev/mla30 && OUT=$OUT bash new/dev/mla30/ab.sh
set -u
o=${OUT:-/tmp/out}
mkdir -p "$o"
cd "$(dirname "$0")/../.."   # new/
(BASE=../base OUT="$o/ab" KVA_STEPS="test bench" KVA_SHAPES="${KVA_SHAPES:-H16 16k|H128}" \
  bash bench/mla_ab_cuda.sh) 2>&1 | tee "$o/log.txt"
rm -rf "$o/ab/l"
if [ "${KVA_MEMCHECK:-1}" = 1 ] && [ -x b/test_cuda_mla ]; then
  KVA_TEST_QUICK=1 timeout 120 compute-sanitizer --tool memcheck b/test_cuda_mla >"$o/memcheck.txt" 2>&1
  echo "memcheck test_cuda_mla quick rc=$?: $(grep -E 'ERROR SUMMARY' "$o/memcheck.txt" | tail -1)" | tee -a "$o/log.txt"
fi
echo "== table (ms; $(nvidia-smi --query-gpu=name --format=csv,noheader))"
grep -E "^r[0-9]" "$o/log.txt" | sed -E 's/"ms": ([0-9.]+).*/\1/' | sort -t: -k1,1 -s
