#!/usr/bin/env bash
# decode_ab.sh - main (bench_cuda + kvattn of main built elsewhere for 90a, carried as base_*.gz) against this tree
# built here (issues 23/19; from the tree root on one GPU: OUT=DIR bash bench/decode_ab.sh).
# 1) build; 2) A/B decode rows alternated twice (base, new, base, new), per call + back to back, graph
# replay on the split shapes, copy ceiling before/after; new with --balanced 1 (the opt-in balanced schedule);
# `kvattn bench --dcp` at 128k; 3) the CUDA tests (quick, concurrently) + memcheck test_cuda_attn + racecheck
# test_cuda_graph. A short table last.
set -u -o pipefail
OUT=${OUT:-out}; mkdir -p $OUT/l; t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader | tee $OUT/l/gpu.txt
gunzip -c base_bench_cuda.gz > /tmp/base_bench && gunzip -c base_kvattn.gz > /tmp/base_kvattn && chmod +x /tmp/base_bench /tmp/base_kvattn
T="test_cuda_attn test_cuda_quant_attn test_cuda_graph test_cuda_dcp test_cuda_tree test_cuda_cascade test_cuda_plan_update"
cmake -S . -B b -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DKVA_BUILD_TESTS=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF -DKVA_WITH_CJSON=OFF -DKVA_WITH_MPI=OFF -DKVA_WITH_NCCL=OFF > $OUT/l/cfg.log 2>&1
timeout 200 ninja -C b -j16 $T bench_cuda kvattn_cli > $OUT/l/build.log 2>&1 || { echo "BUILD FAILED"; grep -a -E "error" $OUT/l/build.log | head -20; tar -czf $OUT/logs.tgz -C $OUT l; exit 1; }
echo "== built at $(el) s"
r() { # bin label args: one bench_cuda line, tagged
  local bin=$1 lab=$2; shift 2
  timeout 40 $bin "$@" 2> $OUT/l/e.txt > /dev/null
  echo "$lab: $(grep -ao 'median [0-9.]* ms, [0-9.]* TB/s\|back to back [0-9.]* ms\|[0-9]* split tasks\|check [a-zA-Z]*\|host enqueue median [0-9.]* us' $OUT/l/e.txt | tr '\n' ' ')" | tee -a $OUT/l/sum.txt
  grep -a "^bench_cuda:" $OUT/l/e.txt | sed "s/^/$lab /" >> $OUT/l/all.txt
}
echo "# gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)" > $OUT/l/all.txt
r b/bench_cuda "r1-new copy" --mode copy --iters 20
S=("1 32767" "1 65535" "1 131071" "16 1023" "16 4095" "64 1023" "64 4095")
for rd in 1 2; do for t in base new; do bin=b/bench_cuda; [ $t = base ] && bin=/tmp/base_bench
  for s in "${S[@]}"; do set -- $s; r $bin "r$rd-$t ${1}x$(($2+1))" --mode decode --batch $1 --context $2 --iters 50; done
done; echo "== round $rd at $(el) s"; done
for s in "1 32767" "1 131071" "16 4095"; do set -- $s; r b/bench_cuda "bal-new ${1}x$(($2+1))" --mode decode --batch $1 --context $2 --iters 50 --balanced 1; done
for t in base new; do bin=b/bench_cuda; [ $t = base ] && bin=/tmp/base_bench
  for s in "1 32767" "1 131071"; do set -- $s; timeout 40 $bin --mode decode --batch $1 --context $2 --iters 30 --graph-layers 8 2>/dev/null | tail -1 | grep -o '"ms": [0-9.]*\|"graph_ms_per_layer": [0-9.]*\|"b2b_ms": [0-9.]*' | tr '\n' ' ' | sed "s/^/graph-$t ${1}x$(($2+1)): /" | tee -a $OUT/l/sum.txt; echo; done; done
r b/bench_cuda "r2-new copy" --mode copy --iters 20
echo "== dcp at $(el) s"
for t in base new; do bin=b/kvattn; [ $t = base ] && bin=/tmp/base_kvattn
  for n in 4 2; do timeout 40 $bin bench --dcp $n --backend cuda --seq-len 131072 --iters 20 > $OUT/l/dcp_${t}_$n.txt 2>&1
    echo "dcp-$t N $n R 1 rc=$?: $(grep -aE 'unsharded|slowest' $OUT/l/dcp_${t}_$n.txt | tr -s ' ' | tr '\n' ';' | cut -c1-260)" | tee -a $OUT/l/sum.txt; done; done
[ $(el) -lt 150 ] && { timeout 40 b/kvattn bench --dcp 4 --backend cuda --seq-len 131072 --batch 8 --iters 10 > $OUT/l/dcp_new_4r8.txt 2>&1; echo "dcp-new N 4 R 8 rc=$?: $(grep -aE 'unsharded|slowest' $OUT/l/dcp_new_4r8.txt | tr -s ' ' | tr '\n' ';' | cut -c1-260)" | tee -a $OUT/l/sum.txt; }
echo "== tests at $(el) s"
# test_cuda_attn's cases in 4 processes (KVA_TEST_ONLY), plain and under memcheck; the other tests whole.
G=("test_grid" "test_decode_mma" "test_split_kv,test_mma_mixed" "test_dcp_plans,test_chunk,test_stale_plan,test_empty_rows,test_force_kernel,test_ragged_refuses_paged_prefill")
for i in 0 1 2 3; do
  ( s=$(date +%s); KVA_TEST_ONLY=${G[$i]} KVA_TEST_QUICK=1 timeout 170 b/test_cuda_attn > $OUT/l/attn_$i.log 2>&1; echo "test_cuda_attn[$i] rc=$? $(( $(date +%s) - s )) s: $(grep -aE 'passed|FAILED|CHECK failed' $OUT/l/attn_$i.log | tail -1 | cut -c1-100)" ) &
  ( s=$(date +%s); KVA_TEST_ONLY=${G[$i]} KVA_TEST_QUICK=1 timeout 175 compute-sanitizer --tool memcheck --error-exitcode 9 b/test_cuda_attn > $OUT/l/mc_attn_$i.log 2>&1; echo "memcheck test_cuda_attn[$i] rc=$? $(( $(date +%s) - s )) s: $(grep -aE 'ERROR SUMMARY' $OUT/l/mc_attn_$i.log | tail -1) $(grep -aE '[0-9]+ passed' $OUT/l/mc_attn_$i.log | tail -1)" ) &
done
for t in ${T#test_cuda_attn }; do ( s=$(date +%s); KVA_TEST_QUICK=1 timeout 170 b/$t > $OUT/l/$t.log 2>&1; echo "$t rc=$? $(( $(date +%s) - s )) s: $(grep -aE 'passed|FAILED|CHECK failed' $OUT/l/$t.log | tail -1 | cut -c1-100)" ) & done
( s=$(date +%s); KVA_TEST_QUICK=1 timeout 175 compute-sanitizer --tool racecheck --error-exitcode 9 b/test_cuda_graph > $OUT/l/rc_graph.log 2>&1; echo "racecheck test_cuda_graph rc=$? $(( $(date +%s) - s )) s: $(grep -aE 'RACECHECK SUMMARY' $OUT/l/rc_graph.log | tail -1)" ) &
wait
echo "== tests done at $(el) s"
tar -czf $OUT/logs.tgz -C $OUT l
cat $OUT/l/sum.txt | grep -v "copy" | sed 's/ median / /; s/ back to back / b2b /' | cut -c1-150
grep "copy" $OUT/l/sum.txt
echo "== end at $(el) s"
