#!/usr/bin/env bash
# dev/mla50/prof.sh - device call 1 of mla50 (issue 16): where the dense
# wgmma MLA decode waits at H 128 q 2 8k (bf16, B 128, block 64). Runs the
# binaries dev/mla50/stage.sh put in .dev/mla50/bins.tar.xz (linked on the
# VM by dev/mla50/side.sh: base = main's two wgmma MLA objects; ef / el = the
# TMA tiles under an L2 evict_first / evict_last policy, KVA_MW_L2 1 / 2):
#   1. the issue row alternated base / ef / el (2 rounds), base with the
#      planner's splits and with --splits 1, items and split tasks printed;
#   2. Nsight Compute metrics of one launch of base and ef (DRAM bytes, L2
#      hit rate, tensor pipe, stall reasons);
#   3. the source-level stall samples of base (dev/mla39/ncu_src.py).
#   usage (device): run(command="bash .dev/mla50/prof.sh", carry=[".dev/mla50"])
set -u
o=${OUT:-/tmp/out}
mkdir -p "$o/l"
d=$(cd "$(dirname "$0")" && pwd)
cd "$d"
t0=$(date +%s)
el() { echo $(($(date +%s) - t0)); }
xz -dc bins.tar.xz | tar -x
gpu=$(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | head -1)
echo "gpu: $gpu; $(ncu --version | tail -1)" | tee "$o/log.txt"
ls bins/*/ | head -20 >>"$o/log.txt"
Q2="--batch 128 --context 8192 --heads 128 --q-len 2 --block-size 64"
b1() { # side, extra args, label
  local j
  j=$(timeout 60 bins/$1/bench_cuda_mla $Q2 --iters 30 $2 2>>"$o/l/bench.err" | tail -1)
  echo "$3 $1: $(echo "$j" | grep -oE '"ms": [0-9.]+|"items": [0-9]+|"tasks": [0-9]+|"check_bad": [-0-9]+' | tr '\n' ' ')"
}
{
  b1 base "--check 1" r0
  b1 ef "--check 1" r0
  for r in 1 2; do
    if [ $r = 1 ]; then S="base ef el"; else S="el ef base"; fi
    for v in $S; do b1 $v "--check 0" r$r; done
    b1 base "--check 0 --splits 1" r$r-nosplit
  done
} 2>&1 | tee "$o/bench.txt"
grep -E "items|median" "$o/l/bench.err" | head -4 >>"$o/log.txt"
echo "== bench $(el) s" | tee -a "$o/log.txt"
Q2N="$Q2 --iters 2 --check 0"
M="gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct,lts__t_sectors_srcunit_tex_op_read.sum"
M="$M,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum"
for s in long_scoreboard barrier short_scoreboard mio_throttle wait math_pipe_throttle no_instruction selected sleeping membar dispatch_stall; do
  M="$M,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio"
done
for v in base ef; do
  timeout 60 ncu --clock-control none --metrics "$M" -k regex:mla_wgmma --launch-skip 1 \
    --launch-count 1 bins/$v/bench_cuda_mla $Q2N >"$o/l/ncu_$v.raw" 2>&1
  echo "== ncu q2 8k $v rc=$?"
  grep -E "__" "$o/l/ncu_$v.raw" | awk '{print $1, $(NF-1), $NF}'
done 2>&1 | tee "$o/ncu.txt"
echo "== ncu metrics $(el) s" | tee -a "$o/log.txt"
timeout 120 ncu --clock-control none --section SourceCounters --section WarpStateStats \
  --import-source yes -k regex:mla_wgmma --launch-skip 1 --launch-count 1 -o /tmp/src_base \
  bins/base/bench_cuda_mla $Q2N >"$o/l/ncu_src_base.log" 2>&1
echo "== ncu source base rc=$? $(el) s" | tee -a "$o/log.txt"
ncu -i /tmp/src_base.ncu-rep --page source --csv --print-source sass >"$o/l/src_base_sass.csv" 2>&1
python3 ncu_src.py "$o/l/src_base_sass.csv" 40 >"$o/ncu_src.txt" 2>&1 || true
gzip -f "$o/l/src_base_sass.csv" && mv "$o/l/src_base_sass.csv.gz" "$o/"
tar -czf "$o/logs.tgz" -C "$o" l && rm -rf "$o/l"
echo "== end $(el) s" | tee -a "$o/log.txt"
echo "== table ($gpu)"
cat "$o/log.txt"; cat "$o/bench.txt"
grep -E "gpu__time|dram__bytes|hit_rate|srcunit|tensor_op|==" "$o/ncu.txt"
head -45 "$o/ncu_src.txt"
