#!/usr/bin/env bash
# decode_ab.sh - the tensor-core decode's A/B on one GPU (issues 23/19): main against a tree, both built here.
# From a folder holding the two source trees: OUT=DIR bash new/bench/decode_ab.sh base new
# 1) build both in parallel (new: the decode-related CUDA tests + bench_cuda + kvattn; base: bench_cuda + kvattn);
# 2) decode rows alternated twice (base, new, base, new), per call + back to back, the copy ceiling before/after;
#    quantized rows (int8, fp8); graph replay (8 layers); `kvattn bench --dcp 4/2` at 128k, R 1 and R 8;
# 3) the CUDA tests (quick, concurrently; test_cuda_attn's cases in 4 processes) + memcheck of test_cuda_attn's
#    decode cases and test_cuda_quant_attn. A short table last.
set -u -o pipefail
B=$(cd "$1" && pwd); N=$(cd "$2" && pwd)
OUT=${OUT:-out}; mkdir -p $OUT/l; t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader | tee $OUT/l/gpu.txt
T="test_cuda_attn test_cuda_quant_attn test_cuda_graph test_cuda_dcp test_cuda_tree test_cuda_cascade test_cuda_plan_update test_cuda_quant"
F="-G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DKVA_BUILD_TESTS=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF -DKVA_WITH_CJSON=OFF -DKVA_WITH_MPI=OFF -DKVA_WITH_NCCL=OFF"
( cmake -S $B -B /tmp/bb $F > $OUT/l/cfg_base.log 2>&1 && timeout 250 ninja -C /tmp/bb -j8 bench_cuda kvattn_cli > $OUT/l/build_base.log 2>&1; echo "base build rc=$?" ) &
( cmake -S $N -B /tmp/bn $F > $OUT/l/cfg_new.log 2>&1 && timeout 250 ninja -C /tmp/bn -j8 $T bench_cuda kvattn_cli > $OUT/l/build_new.log 2>&1; echo "new build rc=$?" ) &
wait
[ -x /tmp/bb/bench_cuda ] && [ -x /tmp/bn/bench_cuda ] || { echo "BUILD FAILED"; grep -a -E "error" $OUT/l/build_*.log | head -20; tar -czf $OUT/logs.tgz -C $OUT l; exit 1; }
echo "== built at $(el) s"
r() { # bin label args: one bench_cuda line, tagged
  local bin=$1 lab=$2; shift 2
  timeout 40 $bin "$@" 2> $OUT/l/e.txt > /dev/null
  echo "$lab: $(grep -ao 'median [0-9.]* ms, [0-9.]* TB/s\|back to back [0-9.]* ms\|[0-9]* items\|[0-9]* split tasks\|check [a-zA-Z]*\|host enqueue median [0-9.]* us' $OUT/l/e.txt | tr '\n' ' ')" | tee -a $OUT/l/sum.txt
  grep -a "^bench_cuda:" $OUT/l/e.txt | sed "s/^/$lab /" >> $OUT/l/all.txt
}
bin_of() { [ $1 = base ] && echo /tmp/bb || echo /tmp/bn; }
r /tmp/bn/bench_cuda "r1 copy" --mode copy --iters 20
S=("16 1023" "16 4095" "64 1023" "64 4095" "1 32767" "1 131071")
Q=("64 4095 int8" "16 1023 int8" "64 4095 fp8")
for rd in 1 2; do for t in base new; do bin=$(bin_of $t)/bench_cuda
  for s in "${S[@]}"; do set -- $s; r $bin "r$rd-$t ${1}x$(($2+1))" --mode decode --batch $1 --context $2 --iters 50; done
  for s in "${Q[@]}"; do set -- $s; r $bin "r$rd-$t ${1}x$(($2+1)) $3" --mode decode --batch $1 --context $2 --iters 50 --quant $3; done
done; echo "== round $rd at $(el) s"; done
for t in base new; do bin=$(bin_of $t)/bench_cuda
  for s in "64 1023" "1 32767"; do set -- $s; timeout 40 $bin --mode decode --batch $1 --context $2 --iters 30 --graph-layers 8 2>/dev/null | tail -1 | grep -o '"graph_ms_per_layer": [0-9.]*' | sed "s/^/graph-$t ${1}x$(($2+1)): /" | tee -a $OUT/l/sum.txt; done; done
r /tmp/bn/bench_cuda "r2 copy" --mode copy --iters 20
echo "== dcp at $(el) s"
for t in base new; do bin=$(bin_of $t)/kvattn
  for nr in "4 1" "2 1" "4 8" "2 8"; do set -- $nr; timeout 40 $bin bench --dcp $1 --backend cuda --seq-len 131072 --batch $2 --iters 20 > $OUT/l/dcp_${t}_$1_$2.txt 2>&1
    echo "dcp-$t N $1 R $2 rc=$?: $(grep -aE 'unsharded|slowest' $OUT/l/dcp_${t}_$1_$2.txt | tr -s ' ' | tr '\n' ';' | cut -c1-260)" | tee -a $OUT/l/sum.txt; done; done
echo "== tests at $(el) s"
G=("test_grid" "test_decode_mma" "test_split_kv,test_many_items,test_mma_mixed" "test_dcp_plans,test_chunk,test_stale_plan,test_empty_rows,test_force_kernel,test_ragged_refuses_paged_prefill")
for i in 0 1 2 3; do
  ( s=$(date +%s); KVA_TEST_ONLY=${G[$i]} KVA_TEST_QUICK=1 timeout 150 /tmp/bn/test_cuda_attn > $OUT/l/attn_$i.log 2>&1; echo "test_cuda_attn[$i] rc=$? $(( $(date +%s) - s )) s: $(grep -aE 'passed|FAILED|CHECK failed' $OUT/l/attn_$i.log | tail -1 | cut -c1-100)" ) &
done
( s=$(date +%s); KVA_TEST_ONLY=test_split_kv,test_many_items,test_decode_mma KVA_TEST_QUICK=1 timeout 160 compute-sanitizer --tool memcheck --error-exitcode 9 /tmp/bn/test_cuda_attn > $OUT/l/mc_attn.log 2>&1; echo "memcheck test_cuda_attn (decode cases) rc=$? $(( $(date +%s) - s )) s: $(grep -aE 'ERROR SUMMARY' $OUT/l/mc_attn.log | tail -1) $(grep -aE '[0-9]+ passed' $OUT/l/mc_attn.log | tail -1)" ) &
( s=$(date +%s); KVA_TEST_QUICK=1 timeout 160 compute-sanitizer --tool memcheck --error-exitcode 9 /tmp/bn/test_cuda_quant_attn > $OUT/l/mc_qattn.log 2>&1; echo "memcheck test_cuda_quant_attn rc=$? $(( $(date +%s) - s )) s: $(grep -aE 'ERROR SUMMARY' $OUT/l/mc_qattn.log | tail -1)" ) &
for t in ${T#test_cuda_attn }; do ( s=$(date +%s); KVA_TEST_QUICK=1 timeout 150 /tmp/bn/$t > $OUT/l/$t.log 2>&1; echo "$t rc=$? $(( $(date +%s) - s )) s: $(grep -aE 'passed|FAILED|CHECK failed' $OUT/l/$t.log | tail -1 | cut -c1-100)" ) & done
wait
echo "== tests done at $(el) s"
tar -czf $OUT/logs.tgz -C $OUT l
grep -v "copy" $OUT/l/sum.txt | sed 's/ median / /; s/ back to back / b2b /' | cut -c1-150
grep "copy" $OUT/l/sum.txt
echo "== end at $(el) s"
