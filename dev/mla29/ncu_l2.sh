#!/usr/bin/env bash
# dev/mla29/ncu_l2.sh - is the 16-bit MLA wgmma decode at H 128 q 2 8k bound
# by L2? Builds bench_cuda_mla of the tree SRC (default: the repository root)
# and profiles one launch of that row (and of H 128 q 1 4k) at the real clocks
# (--clock-control none): L2, DRAM and L1 throughput as % of peak, L2
# sectors read by the SMs, hit rate, duration.
#   usage (device): OUT=$OUT bash dev/mla29/ncu_l2.sh [SRC]
set -u
o=${OUT:-/tmp/out}
src=${1:-.}
bd=${BD:-/tmp/mla29_ncu_bd}
mkdir -p "$o"
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$o/ncu_l2.txt"
cmake -S "$src" -B "$bd" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF \
  -DKVA_WITH_CJSON=OFF -DKVA_WITH_MPI=OFF -DKVA_WITH_NCCL=OFF >"$o/ncu_l2_build.txt" 2>&1
timeout 300 ninja -C "$bd" -j"$(nproc)" bench_cuda_mla >>"$o/ncu_l2_build.txt" 2>&1 ||
  { echo "BUILD FAILED" | tee -a "$o/ncu_l2.txt"; exit 1; }
M="gpu__time_duration.sum,lts__t_sectors.avg.pct_of_peak_sustained_elapsed"
M="$M,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum"
M="$M,lts__t_sector_hit_rate.pct,dram__throughput.avg.pct_of_peak_sustained_elapsed"
M="$M,l1tex__m_xbar2l1tex_read_bytes.sum.per_second,lts__throughput.avg.pct_of_peak_sustained_elapsed"
M="$M,l1tex__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum"
M="$M,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
M="$M,gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
for row in "q2_8k|--context 8192 --q-len 2" "q1_4k|--context 4096"; do
  n=${row%%|*}
  timeout 100 ncu --clock-control none --metrics "$M" -k regex:mla_wgmma --launch-skip 1 \
    --launch-count 1 "$bd/bench_cuda_mla" --batch 128 --heads 128 ${row#*|} --iters 2 --check 0 \
    >"$o/ncu_l2_$n.raw" 2>&1
  echo "== ncu bf16 H128 $n rc=$?" | tee -a "$o/ncu_l2.txt"
  grep -E "__" "$o/ncu_l2_$n.raw" | awk '{print $1, $(NF-1), $NF}' | tee -a "$o/ncu_l2.txt"
done
