#!/usr/bin/env bash
# dev/mla29/ncu.sh - where the MLA wgmma decode waits: builds bench_cuda_mla of
# the tree SRC (default: the repository root) and profiles one launch of the
# H 128 q 2 8k bf16 row (split-key schedule) and of the q 2 8k FP8 row
# (alternating tiles, v1) with a few Nsight Compute metrics: duration, SM and
# tensor-pipe utilization, issue/eligible warps, stall reasons per issue,
# local-memory (spill) traffic, L2 hit rate and DRAM bytes.
#   usage (device): OUT=$OUT bash dev/mla29/ncu.sh [SRC]
set -u
o=${OUT:-/tmp/out}
src=${1:-.}
bd=${BD:-/tmp/mla29_ncu_bd}
mkdir -p "$o"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$o/ncu.txt"
cmake -S "$src" -B "$bd" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF \
  -DKVA_WITH_CJSON=OFF -DKVA_WITH_MPI=OFF -DKVA_WITH_NCCL=OFF >"$o/ncu_build.txt" 2>&1
timeout 300 ninja -C "$bd" -j"$(nproc)" bench_cuda_mla >>"$o/ncu_build.txt" 2>&1 ||
  { echo "BUILD FAILED" | tee -a "$o/ncu.txt"; grep error "$o/ncu_build.txt" | head; exit 1; }
M="gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed"
# The tensor-pipe counter names differ between ncu versions: take what this one has.
ncu --query-metrics 2>/dev/null | grep -oE "^sm__pipe_tensor[a-z_]*cycles_active" | sort -u >"$o/ncu_tensor_names.txt"
for t in $(cat "$o/ncu_tensor_names.txt"); do M="$M,$t.avg.pct_of_peak_sustained_active"; done
M="$M,smsp__issue_active.avg.per_cycle_active,smsp__warps_eligible.avg.per_cycle_active"
M="$M,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
M="$M,smsp__inst_executed.sum,l1tex__t_requests_pipe_lsu_mem_local_op_ld.sum"
M="$M,l1tex__t_requests_pipe_lsu_mem_local_op_st.sum,lts__t_sector_hit_rate.pct"
M="$M,dram__bytes_read.sum,lts__t_bytes.sum.per_second,dram__bytes_read.sum.per_second"
for row in "bf16_q2_8k|" "fp8_q2_8k|--kv-quant fp8"; do
  n=${row%%|*}
  timeout 150 ncu --metrics "$M" -k regex:mla_wgmma --launch-skip 1 --launch-count 1 \
    "$bd/bench_cuda_mla" --batch 128 --context 8192 --heads 128 --q-len 2 ${row#*|} \
    --iters 2 --check 0 >"$o/ncu_$n.raw" 2>&1
  echo "== ncu $n rc=$?" | tee -a "$o/ncu.txt"
  grep -E "__" "$o/ncu_$n.raw" | awk '{v=$NF; gsub(",","",v);
    if ($1 !~ /stalled/ || v+0 >= 0.05) print $1, $(NF-1), $NF}' | tee -a "$o/ncu.txt"
done
