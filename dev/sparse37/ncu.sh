#!/usr/bin/env bash
# dev/sparse37/ncu.sh - the stall breakdown of the sparse MLA decode on the
# wgmma body (issue 17; never measured so far): builds like ab.sh (this tree
# and main's MLA kernel files, bench/mla_ab_cuda.sh with no steps), then
# Nsight Compute on one launch of mla_wgmma_kernel for decode H 128 over
# fp8_ds_mla (the ALT_EARLY schedule) and over a bf16 cache (the split-key
# schedule, for contrast), base (main's kernels) and mine: SpeedOfLight,
# WarpStateStats, the per-issue stall ratios, and the SASS lines with the most
# stall samples (SourceCounters). Not run yet (device budget).
#   OUT=$OUT bash new/dev/sparse37/ncu.sh base new     (~3 min on an H100)
#   KVA_NCU_SIDES (default "base mine")
set -u
base=$(cd "$1" && pwd) new=$(cd "$2" && pwd)
o=${OUT:-/tmp/out}
mkdir -p "$o/l"
cd "$new"
if [ ! -x b/kvattn ] || [ ! -x b/kvattn_base ]; then
  BASE=$base OUT=$o/ab KVA_STEPS=none bash bench/mla_ab_cuda.sh >"$o/l/ab_build.txt" 2>&1
  [ -x b/kvattn ] && [ -x b/kvattn_base ] || { echo "BUILD FAILED"; tail -5 "$o/l/ab_build.txt"; exit 1; }
fi
S="--batch 128 --q-len 2 --context 8192 --heads 128 --topk 2048 --iters 2"
for v in ${KVA_NCU_SIDES:-base mine}; do
  s=""; [ $v = base ] && s=_base
  for c in ds_mla bf16; do
    timeout 150 ncu --clock-control none --section SpeedOfLight --section WarpStateStats \
      --section SourceCounters --section Occupancy \
      --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
      -k regex:mla_wgmma_kernel --launch-skip 2 --launch-count 1 \
      b/kvattn$s bench --mla-sparse --backend cuda $S --cache $c >"$o/l/ncu_${v}_$c.txt" 2>&1
    echo "== ncu $v $c rc=$?"
    grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Issued Warp|Eligible Warps|No Eligible|Warp Cycles Per Issued|L2 Hit|Registers Per" \
      "$o/l/ncu_${v}_$c.txt" | tr -s ' ' | head -12
    grep -E "issue_stalled" "$o/l/ncu_${v}_$c.txt" | tr -s ' ' | sort -k3 -g -r | head -8
  done
done
tar -czf "$o/ncu_logs.tgz" -C "$o" l
