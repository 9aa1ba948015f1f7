#!/usr/bin/env bash
# dev/mla37/ab.sh - one device call for issue 16 (branch mla37): from a folder
# holding base/ (main) and new/ (branch mla37), builds new/ and links base's
# MLA kernels beside it (bench/mla_ab_cuda.sh: smoke run, MLA tests quick),
# then times the dense H 128 rows (bf16 and FP8, q 1 4k and q 2 8k), base and
# new alternated KVA_ROUNDS (2) times (new's request 0 checked against the
# reference in round 1), Nsight Compute (real clocks) of one H 128 q 2 8k
# launch per side (DRAM bytes, L2, duration, tensor pipe) and memcheck of
# test_cuda_mla quick. Raw logs in $OUT/ab/logs.tgz and $OUT/*.txt, the table
# last. ~3 min on a warm H100.
# The measured run of 2026-11-28 (bench/results/h100_2026-11-28_mla37.txt)
# came from commit d50fe76 of this script, whose tree also had the launch
# knobs KVA_MLA_TMA / KVA_MLA_CLUSTER (variants tma_cl4, split_cl4, tma_cl1,
# split_cl1); the branch dropped the knobs and the cluster launch, and
# tma_cl1 is its kernel (byte-identical cubin) and launch.
#   usage (device): cd .dev/mla37 && OUT=$OUT bash new/dev/mla37/ab.sh
set -u
o=${OUT:-/tmp/out}
mkdir -p "$o"
cd "$(dirname "$0")/../.."   # new/
t0=$(date +%s)
el() { echo $(($(date +%s) - t0)); }
(BASE=../base OUT="$o/ab" KVA_STEPS="${KVA_AB_STEPS:-test}" KVA_SHAPES=H128 \
  bash bench/mla_ab_cuda.sh) 2>&1 | tee "$o/log.txt"
[ -x b/bench_cuda_mla ] && [ -x b/bench_cuda_mla_base ] || { echo "no binaries"; exit 1; }
smoke_ok=1
grep -q "smoke mine rc=0" "$o/log.txt" || smoke_ok=0
ROWS=("q1 4k|--batch 128 --context 4096 --heads 128"
  "q2 8k|--batch 128 --context 8192 --heads 128 --q-len 2")
FROWS=("q1 4k fp8|--batch 128 --context 4096 --heads 128 --kv-quant fp8"
  "q2 8k fp8|--batch 128 --context 8192 --heads 128 --q-len 2 --kv-quant fp8")
VARS=("base|" "new|")
[ $smoke_ok = 1 ] || { echo "smoke run failed: no timings"; exit 1; }
bench1() { # variant env, binary suffix, rows..., check
  local v=$1 envs=$2 s=$3 chk=$4; shift 4
  for m in "$@"; do
    j=$(env $envs timeout 60 b/bench_cuda_mla$s ${m#*|} --iters 30 --check $chk 2>>"$o/bench.err" | tail -1)
    echo "r$r $v ${m%%|*}: $(echo "$j" | grep -oE '"ms": [0-9.]+|"tflops": [0-9.]+|"check_bad": [-0-9]+' | tr '\n' ' ')"
  done
}
for r in $(seq 1 "${KVA_ROUNDS:-2}"); do
  for vv in "${VARS[@]}"; do
    v=${vv%%|*}; envs=${vv#*|}; s=""; [ $v = base ] && s=_base
    chk=0; [ $r = 1 ] && [ $v != base ] && chk=1
    bench1 "$v" "$envs" "$s" $chk "${ROWS[@]}"
    bench1 "$v" "$envs" "$s" 0 "${FROWS[@]}"
  done
done 2>&1 | tee "$o/bench.txt"
echo "== bench $(el) s" | tee -a "$o/log.txt"
M="gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct"
M="$M,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum"
M="$M,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
NV=("base|" "new|")
for vv in "${NV[@]}"; do
  v=${vv%%|*}; envs=${vv#*|}; s=""; [ $v = base ] && s=_base
  env $envs timeout 60 ncu --clock-control none --metrics "$M" -k regex:mla_wgmma --launch-skip 1 \
    --launch-count 1 b/bench_cuda_mla$s --batch 128 --heads 128 --context 8192 --q-len 2 \
    --iters 2 --check 0 >"$o/ncu_$v.raw" 2>&1
  echo "== ncu q2 8k $v rc=$?"
  grep -E "__" "$o/ncu_$v.raw" | awk '{print $1, $(NF-1), $NF}'
done 2>&1 | tee "$o/ncu.txt"
echo "== ncu $(el) s" | tee -a "$o/log.txt"
if [ "${KVA_MEMCHECK:-1}" = 1 ]; then
  KVA_TEST_QUICK=1 timeout 110 compute-sanitizer --tool memcheck b/test_cuda_mla >"$o/memcheck.txt" 2>&1
  echo "memcheck test_cuda_mla quick rc=$?: $(grep -E 'ERROR SUMMARY' "$o/memcheck.txt" | tail -1)" | tee -a "$o/log.txt"
fi
echo "== end $(el) s" | tee -a "$o/log.txt"
echo "== table (ms; $(nvidia-smi --query-gpu=name --format=csv,noheader))"
grep -E "test_cuda|smoke|memcheck" "$o/log.txt"
sort -t: -k1,1 -s "$o/bench.txt" | grep -E "^r"
grep -E "dram__bytes|gpu__time|hit_rate|==" "$o/ncu.txt"
