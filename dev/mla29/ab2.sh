#!/usr/bin/env bash
# dev/mla29/ab2.sh - the short A/B of the two-piece tile copies (16-bit dense
# rows): from a folder holding base/ (main) and new/ (this branch), builds new/
# and links base's MLA kernels beside it (bench/mla_ab_cuda.sh), the MLA tests
# quick, then H 128 q 1 4k and q 2 8k bf16,
# base and new alternated KVA_ROUNDS times (new checked in round 1), then
# memcheck of test_cuda_mla quick.
# new/ must be a tree at commit ca27a60 (the two-piece copies; the branch head
# went back to main's loop), e.g. git archive --prefix=new/ ca27a60.
#   usage (device): cd .dev/mla29 && OUT=$OUT bash new/dev/mla29/ab2.sh
set -u
o=${OUT:-/tmp/out}
mkdir -p "$o"
cd "$(dirname "$0")/../.."   # new/
(BASE=../base OUT="$o/ab" KVA_STEPS="test" bash bench/mla_ab_cuda.sh) 2>&1 | tee "$o/log.txt"
ROWS=("H128 q1 4k|--batch 128 --context 4096 --heads 128"
  "H128 q2 8k|--batch 128 --context 8192 --heads 128 --q-len 2")
for r in $(seq 1 "${KVA_ROUNDS:-2}"); do
  for s in base mine; do
    x=""; [ $s = base ] && x=_base
    for m in "${ROWS[@]}"; do
      chk=0; [ "$r" = 1 ] && [ $s = mine ] && chk=1
      j=$(timeout 60 b/bench_cuda_mla$x ${m#*|} --iters 30 --check $chk 2>>"$o/bench.err" | tail -1)
      echo "r$r $s ${m%%|*}: $(echo "$j" | grep -oE '"ms": [0-9.]+|"check_bad": [-0-9]+' | tr '\n' ' ')"
    done
  done
done | tee -a "$o/log.txt"
if [ "${KVA_MEMCHECK:-1}" = 1 ]; then
  KVA_TEST_QUICK=1 timeout 100 compute-sanitizer --tool memcheck b/test_cuda_mla >"$o/memcheck.txt" 2>&1
  echo "memcheck test_cuda_mla quick rc=$?: $(grep -E 'ERROR SUMMARY' "$o/memcheck.txt" | tail -1)" | tee -a "$o/log.txt"
fi
echo "== table (ms; $(nvidia-smi --query-gpu=name --format=csv,noheader))"
grep -E "^r[0-9]" "$o/log.txt" | sed -E 's/"ms": ([0-9.]+).*/\1/' | sort -t: -k1,1 -s
