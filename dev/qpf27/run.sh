#!/usr/bin/env bash
# qpf27 device call: binaries built on the dev VM (Release, CUDA 13.0, sm_90a, base = main,
# new = branch qpf27). Phase 1 (in parallel): new's test_cuda_prefill_mma (full),
# test_cuda_quant_prefill, test_cuda_quant_attn (quick), compute-sanitizer memcheck of
# test_cuda_prefill_mma and test_cuda_quant_prefill (quick). Phase 2: bench_cuda rows,
# base, new, base, new: the quantized prefill rows of scripts/cuda_qprefill.sh (4 x 1024
# after 3072 and 1 x 4096, int8 / int8-token / int8-token-v16 / fp8), the 16-bit
# mma.sync prefill forced (prefill_mma_sm80): D 64 and D 256 causal 1 x 4096,
# 8 x 1024, 4 x 1024 after 3072 (D 128), and the quantized decode 64 x 4k (rows 'D ...').
set -u
cd "$(dirname "$0")"
out=${OUT:-out}; mkdir -p "$out"
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
for f in bins/*.xz; do xz -dc -T4 "$f" > "${f%.xz}" & done; wait
chmod +x bins/*
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
el unpacked
tq() { # label quick binary [sanitizer]
  local s=$(date +%s) q=$2 l=$1 b=$3; shift 3
  if [ "$q" = 1 ]; then export KVA_TEST_QUICK=1; else unset KVA_TEST_QUICK; fi
  timeout ${TT:-170} "$@" bins/$b >"$out/t_$l.log" 2>&1; rc=$?
  echo "$l: exit $rc ($(( $(date +%s) - s )) s); $(grep -E 'ERROR SUMMARY' "$out/t_$l.log" | tail -n 1) $(grep -v '^=====' "$out/t_$l.log" | tail -n 1)" >"$out/r_$l.txt"
}
tq prefill_mma_full 0 new_test_cuda_prefill_mma &
tq quant_prefill_quick 1 new_test_cuda_quant_prefill &
tq quant_attn_quick 1 new_test_cuda_quant_attn &
tq memcheck_prefill_mma_quick 1 new_test_cuda_prefill_mma compute-sanitizer --tool memcheck --error-exitcode 9 &
tq memcheck_quant_prefill_quick 1 new_test_cuda_quant_prefill compute-sanitizer --tool memcheck --error-exitcode 9 &
wait
cat "$out"/r_*.txt | tee "$out/tests.txt"
el tests
unset KVA_TEST_QUICK
rows=()
for s in "--batch 4 --context 3072 --q-len 1024" "--batch 1 --context 0 --q-len 4096"; do
  for qf in int8 int8-token int8-token-v16 fp8; do rows+=("$s --quant $qf"); done
done
m="--kernel prefill_mma_sm80"
rows+=("--batch 1 --context 0 --q-len 4096 --head-dim 64 $m" "--batch 1 --context 0 --q-len 4096 --head-dim 256 $m"
       "--batch 8 --context 0 --q-len 1024 $m" "--batch 4 --context 3072 --q-len 1024 $m")
# the quantized decode (its Q' staging changed too): 64 x 4k
for qf in int8 int8-token int8-token-v16 fp8; do rows+=("D --batch 64 --context 4095 --quant $qf"); done
for r in 1 2; do
  for t in base new; do
    for i in "${!rows[@]}"; do
      a=${rows[$i]}; md=prefill; it=${ITERS:-20}
      [ "${a:0:2}" = "D " ] && { md=decode; a=${a:2}; it=30; }
      line=$(bins/${t}_bench_cuda --mode $md $a --iters $it 2>&1 >/dev/null | grep "^bench_cuda:" | head -n 1)
      echo "$t r$r s$i ${rows[$i]} | $line" >>"$out/bench_raw.log"
    done
  done
  el "round $r"
done
# table: row, per-call median ms base r1 r2 / new r1 r2
for i in "${!rows[@]}"; do
  v() { grep "^$1 r$2 s$i " "$out/bench_raw.log" | grep -oE 'median [0-9.]+ ms' | grep -oE '[0-9.]+' | head -n 1; }
  c=$(grep "^new r1 s$i " "$out/bench_raw.log" | grep -oE 'check [a-z]+' | head -n 1)
  printf "s%-2d %-62s base %s %s  new %s %s  %s\n" $i "${rows[$i]}" "$(v base 1)" "$(v base 2)" "$(v new 1)" "$(v new 2)" "$c"
done | tee "$out/table.txt"
