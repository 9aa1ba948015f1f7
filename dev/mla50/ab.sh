#!/usr/bin/env bash
# dev/mla50/ab.sh - device call 2 of mla50 (issue 16): base (main) against the
# sides built by dev/mla50/side.sh and staged by dev/mla50/stage.sh
# (KVA_SIDES, default "ef pf new c2 c4"; see dev/mla50/README in the note):
#   ef  TMA tiles under an L2 evict_first policy (KVA_MW_L2=1)
#   pf  each warpgroup's tile two pairs ahead prefetched into L2 (KVA_MW_PF=1)
#   new pf + ef
#   c2 / c4  new launched in clusters of 2 / 4 CTAs (KVA_MW_CLUSTER)
# 1. tests (in parallel): new: test_cuda_mla, _mla_run, _mla_sparse quick,
#    test_cuda_mla_nan; c2 / c4: test_cuda_mla quick;
# 2. the issue row (bf16 H 128 q 2 8k, B 128, block 64) for every side, the
#    other rows (bf16 q 1 4k, FP8 q 1 4k, H 16 16k) for base and new,
#    alternated KVA_ROUNDS (2) times (odd rounds base first); round 1 checks
#    request 0 of every non-base side against the reference;
# 3. Nsight Compute metrics of one issue-row launch of new and c4, while time
#    is left; memcheck of new's test_cuda_mla quick, while time is left.
#   KVA_NEW the side with the tests and the other rows (default new);
#   KVA_MEMCHECK=0 skips memcheck. Call 3 ran KVA_SIDES=perq KVA_NEW=perq
#   KVA_MEMCHECK=0 (perq: kva__dmma_rows<true>, one step per query).
#   usage (device): run(command="bash .dev/mla50/ab.sh", carry=[".dev/mla50"])
set -u
o=${OUT:-/tmp/out}
mkdir -p "$o/l"
d=$(cd "$(dirname "$0")" && pwd)
cd "$d"
t0=$(date +%s)
el() { echo $(($(date +%s) - t0)); }
xz -dc bins.tar.xz | tar -x
SIDES=${KVA_SIDES-ef pf new c2 c4}
N=${KVA_NEW:-new} # the side that gets the tests and the other rows
gpu=$(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | head -1)
echo "gpu: $gpu; sides base $SIDES" | tee "$o/log.txt"
tst() { # side, test, quick
  local q=""; [ "$3" = 1 ] && q="KVA_TEST_QUICK=1"
  env $q timeout 90 bins/$1/$2 >"$o/l/${2}_$1.log" 2>&1
  echo "$2 $( [ "$3" = 1 ] && echo quick || echo whole) ($1) rc=$?: $(grep -E 'passed|FAILED|CHECK failed' "$o/l/${2}_$1.log" | tail -1 | cut -c1-140)"
}
(tst $N test_cuda_mla 1 & tst $N test_cuda_mla_run 1 & tst $N test_cuda_mla_sparse 1 &
  tst $N test_cuda_mla_nan 0 &
  for v in c2 c4; do [ -x bins/$v/test_cuda_mla ] && tst $v test_cuda_mla 1 & done
  wait) 2>&1 | tee -a "$o/log.txt"
echo "== tests $(el) s" | tee -a "$o/log.txt"
IROW="bf16 q2 8k|--batch 128 --context 8192 --heads 128 --q-len 2 --block-size 64"
ROWS=("bf16 q1 4k|--batch 128 --context 4096 --heads 128 --block-size 64"
  "fp8 q1 4k|--batch 128 --context 4096 --heads 128 --kv-quant fp8"
  "bf16 H16 16k|--heads 16 --context 16384")
bench1() { # row, sides...
  local m=$1 j chk; shift
  for v in "$@"; do
    chk=0; [ $r = 1 ] && [ $v != base ] && chk=1
    j=$(timeout 60 bins/$v/bench_cuda_mla ${m#*|} --iters 30 --check $chk 2>>"$o/l/bench.err" | tail -1)
    echo "r$r ${m%%|*} $v: $(echo "$j" | grep -oE '"ms": [0-9.]+|"check_bad": [-0-9]+' | tr '\n' ' ')"
  done
}
ALL="base $SIDES"
RALL=$(echo $ALL | tr ' ' '\n' | tac | tr '\n' ' ')
for r in $(seq 1 "${KVA_ROUNDS:-2}"); do
  if [ $((r % 2)) = 1 ]; then S=$ALL; S2="base $N"; else S=$RALL; S2="$N base"; fi
  bench1 "$IROW" $S
  for m in "${ROWS[@]}"; do bench1 "$m" $S2; done
  echo "== round $r $(el) s" >&2
done 2>&1 | tee "$o/bench.txt"
echo "== bench $(el) s" | tee -a "$o/log.txt"
Q2="--batch 128 --heads 128 --context 8192 --q-len 2 --block-size 64 --iters 2 --check 0"
M="gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct"
M="$M,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
M="$M,launch__grid_size,launch__cluster_dim_x"
for v in $N c4; do
  [ -x bins/$v/bench_cuda_mla ] || continue
  [ "$(el)" -lt 80 ] || break
  timeout 40 ncu --clock-control none --metrics "$M" -k regex:mla_wgmma --launch-skip 1 \
    --launch-count 1 bins/$v/bench_cuda_mla $Q2 >"$o/l/ncu_$v.raw" 2>&1
  echo "== ncu q2 8k $v rc=$?"
  grep -E "__" "$o/l/ncu_$v.raw" | awk '{print $1, $(NF-1), $NF}'
done 2>&1 | tee "$o/ncu.txt"
if [ "${KVA_MEMCHECK:-1}" = 1 ] && [ "$(el)" -lt 85 ]; then
  KVA_TEST_QUICK=1 timeout 40 compute-sanitizer --tool memcheck bins/$N/test_cuda_mla >"$o/l/memcheck.log" 2>&1
  echo "memcheck test_cuda_mla quick ($N) rc=$?: $(grep -E 'ERROR SUMMARY' "$o/l/memcheck.log" | tail -1)" | tee -a "$o/log.txt"
else
  echo "memcheck skipped at $(el) s" | tee -a "$o/log.txt"
fi
tar -czf "$o/logs.tgz" -C "$o" l && rm -rf "$o/l"
echo "== end $(el) s" | tee -a "$o/log.txt"
echo "== table (ms; $gpu)"
cat "$o/log.txt"
sort -s -k2,4 "$o/bench.txt" | grep -E "^r"
cat "$o/ncu.txt"
