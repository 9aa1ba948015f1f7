#!/usr/bin/env bash
# dev/sparse37/ab.sh - one device call for the sparse MLA crossover (issue 17):
# builds this tree and main's four MLA kernel files (bench/mla_ab_cuda.sh,
# no steps: build, base relink, dense smoke), then
#   1. a sparse smoke run of this tree's crossover shape (H 128 fp8_ds_mla,
#      checked against the reference; a hang or a failure stops here);
#   2. test_cuda_mla_sparse (all cases) and test_cuda_mla quick;
#   3. the issue-17 rows, base and mine alternated KVA_ROUNDS times (each
#      checked against the reference backend: the CUDA path of the bench
#      ignores the --no-check the later rounds pass);
#   4. compute-sanitizer memcheck of test_cuda_mla_sparse quick (includes
#      the H 96 crossover case);
# and prints a table last. Run from the parent of the two trees:
#   OUT=$OUT bash new/dev/sparse37/ab.sh base new
#   KVA_ROUNDS (2), KVA_MEMCHECK (1), KVA_ROWS (bash regex of row names, all)
set -u
base=$(cd "$1" && pwd) new=$(cd "$2" && pwd)
o=${OUT:-/tmp/out}
mkdir -p "$o/l"
t0=$(date +%s)
el() { echo $(($(date +%s) - t0)); }
cd "$new"
BASE=$base OUT=$o/ab KVA_STEPS=none bash bench/mla_ab_cuda.sh >"$o/l/ab_build.txt" 2>&1
rc=$?
cat "$o/l/ab_build.txt" | tail -6
[ -x b/kvattn_base ] && [ -x b/kvattn ] || { echo "BUILD FAILED rc=$rc"; tar -czf "$o/logs.tgz" -C "$o" l ab; exit 1; }
echo "== built $(el) s"
timeout 40 b/kvattn bench --mla-sparse --backend cuda --iters 2 --batch 8 --q-len 2 --context 3000 \
  --heads 128 --topk 512 >"$o/l/smoke_sparse.log" 2>&1
rc=$?
echo "sparse smoke mine rc=$rc: $(grep -E 'ms' "$o/l/smoke_sparse.log" | tail -1 | tr -s ' ')"
[ $rc = 0 ] || { tail -5 "$o/l/smoke_sparse.log"; tar -czf "$o/logs.tgz" -C "$o" l ab; exit 1; }
(timeout 200 b/test_cuda_mla_sparse >"$o/l/test_sparse.log" 2>&1; echo "test_cuda_mla_sparse (all) rc=$?: $(grep -E 'passed|FAILED|failed' "$o/l/test_sparse.log" | tail -1 | cut -c1-140)") &
(KVA_TEST_QUICK=1 timeout 150 b/test_cuda_mla >"$o/l/test_mla.log" 2>&1; echo "test_cuda_mla quick rc=$?: $(grep -E 'passed|FAILED|failed' "$o/l/test_mla.log" | tail -1 | cut -c1-140)") &
wait
grep -hE "FAILED|CHECK failed" "$o"/l/test_*.log | head -10
echo "== tests $(el) s"
ROWS=("decode H128 fp8|--batch 128 --q-len 2 --context 8192 --heads 128 --topk 2048"
  "decode H128 bf16 cache|--batch 128 --q-len 2 --context 8192 --heads 128 --topk 2048 --cache bf16"
  "decode H16|--batch 128 --q-len 2 --context 8192 --heads 16 --topk 2048"
  "decode H64 (H16 padded)|--batch 128 --q-len 2 --context 8192 --heads 64 --topk 2048"
  "prefill 4k fp8 mixed|--batch 0 --prefill 4096 --context 8192 --heads 128 --topk 2048"
  "prefill 4k separate|--batch 0 --prefill 4096 --context 8192 --heads 128 --topk 2048 --mode separate")
for r in $(seq 1 "${KVA_ROUNDS:-2}"); do
  for v in base mine; do
    s=""; [ $v = base ] && s=_base
    nc=""; [ "$r" -gt 1 ] && nc=--no-check
    for m in "${ROWS[@]}"; do
      [[ "${m%%|*}" =~ ${KVA_ROWS:-.} ]] || continue
      l=$(timeout 60 b/kvattn$s bench --mla-sparse --backend cuda --iters 20 $nc ${m#*|} 2>&1 | grep -E ' ms ' | tail -1 | tr -s ' ')
      echo "r$r $v ${m%%|*}: $l"
    done
  done
done | tee "$o/l/bench.log"
echo "== bench $(el) s"
if [ "${KVA_MEMCHECK:-1}" = 1 ]; then
  KVA_TEST_QUICK=1 timeout 200 compute-sanitizer --tool memcheck b/test_cuda_mla_sparse >"$o/l/memcheck.log" 2>&1
  echo "memcheck test_cuda_mla_sparse quick rc=$?: $(grep -E 'ERROR SUMMARY' "$o/l/memcheck.log" | tail -1)"
fi
echo "== table (ms, $(cat "$o/ab/l/gpu.txt" 2>/dev/null | head -1))"
python3 - "$o/l/bench.log" <<'PY'
import re, sys, collections
d = collections.defaultdict(lambda: collections.defaultdict(list))
for ln in open(sys.argv[1]):
    m = re.match(r"r(\d+) (base|mine) (.*?): .* ([0-9.]+) ms ", ln)
    if m: d[m.group(3)][m.group(2)].append(float(m.group(4)))
for k, v in d.items():
    b, n = v.get("base", []), v.get("mine", [])
    r = (min(b) / min(n)) if b and n else 0
    print("%-26s base %-18s mine %-18s base/mine %.3f" % (k, "/".join("%.4f" % x for x in b), "/".join("%.4f" % x for x in n), r))
PY
tar -czf "$o/logs.tgz" -C "$o" l ab
echo "== end $(el) s"
