#!/usr/bin/env bash
# dev/mlaws28/ncu.sh - per-reason stall ratios (ncu) of one launch, H 128 q 1 4k bf16, base vs new: from a
# folder holding base/ and new/ (new/ with bench/mla_ab_cuda.sh), builds both if needed. Not run yet.
#   usage (device): cd .dev/mlaws28 && OUT=$OUT bash ncu.sh   (copy this file next to base/ and new/)
o=${OUT:-/tmp/out}
cd "$(dirname "$0")/new"
if [ ! -x b/bench_cuda_mla ] || [ ! -x b/bench_cuda_mla_base ]; then
  BASE=../base OUT="$o/ab" KVA_STEPS=none bash bench/mla_ab_cuda.sh >"$o/build.txt" 2>&1
  tail -4 "$o/build.txt"
fi
for v in base mine; do
  s=; [ $v = base ] && s=_base
  timeout 100 ncu --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,regex:sm__pipe_tensor.*cycles_active.avg.pct_of_peak_sustained_active,sm__throughput.avg.pct_of_peak_sustained_elapsed,gpu__time_duration.sum" \
    -k regex:mla_wgmma --launch-skip 2 --launch-count 1 b/bench_cuda_mla$s --batch 128 --context 4096 --heads 128 --iters 3 --check 0 >"$o/stall_$v.txt" 2>&1
  echo "== $v rc=$?"
  grep -E "stalled|inst_executed|pipe_tensor|sm__throughput|duration" "$o/stall_$v.txt" |
    awk '{v=$NF; gsub(",","",v); if (v+0 >= 0.05 || $0 ~ /inst_exec|pipe_tensor|throughput|duration/) print $1, $NF}'
done
rm -rf "$o/ab"
