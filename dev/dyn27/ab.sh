#!/usr/bin/env bash
# dev/dyn27/ab.sh - the 16-bit decode's fixed cost per call (issues 23, 19, 20) on one GPU, in one call:
# base (main) against a tree, both built here, then a per-CTA trace of both (dev/dyn27/trace.py).
# From a folder holding the two source trees: OUT=DIR bash new/dev/dyn27/ab.sh base new
#   1) build both in parallel (90a; new also the decode tests);
#   2) device copies of 1 GiB, and of 64 / 128 / 256 MiB (read + write = 128 / 256 / 512 MiB: the KV bytes
#      of a 4-way and a 2-way shard of 1 x 128k and of the unsharded 1 x 128k): the ceilings per call;
#   3) rows alternated twice (base, new, base, new): R 1 at 32k / 64k / 128k (per call, back to back,
#      graph replay of 8 layers), 16 x 1k, 16 x 4k, 64 x 4k bf16, 64 x 4k with 8 draft tokens at GQA 8
#      (four items per kv head read the same K/V), int8 and fp8 64 x 4k, and
#      `kvattn bench --dcp 4|2 --backend cuda` at 128k R 1 (every line of it kept, tagged);
#   4) tests of the new tree (quick) + memcheck of test_cuda_attn's decode cases and test_cuda_quant_attn;
#   5) the trace: dev/dyn27/trace.py run on both trees, bench_cuda rebuilt, R 1 at 32k and 128k: per CTA
#      %globaltimer at entry, after griddepcontrol.wait, first step landed, loop ends, written, counted,
#      the merger's fence and merge, end (one call on an idle GPU, twice, and the 4th of 4 back to
#      back), and the host time of the run path's runtime calls beside an empty kernel's launch.
# Every bench_cuda line goes to $OUT/all.txt tagged "rN-base|rN-new LABEL", the dcp blocks tagged
# "rN-base|rN-new dcpN", so `scripts/results.py cuda --raw FILE --tag r1-new` reads them; the test lines go to
# $OUT/tests.txt, the trace to $OUT/trace.txt, as they come. KVA_ROUNDS (default 2) alternated rounds,
# KVA_TRACE_TREES (default "base new") the traced trees. On an H200: ~235 s wall with two rounds and both traces.
set -u -o pipefail
B=$(cd "$1" && pwd); N=$(cd "$2" && pwd)
OUT=${OUT:-out}; mkdir -p $OUT/l; t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader | tee $OUT/l/gpu.txt
echo "# gpu: $(cat $OUT/l/gpu.txt)" > $OUT/all.txt
T="test_cuda_attn test_cuda_quant_attn test_cuda_dcp test_cuda_plan_update"
F="-G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DKVA_BUILD_TESTS=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF -DKVA_WITH_CJSON=OFF -DKVA_WITH_MPI=OFF -DKVA_WITH_NCCL=OFF"
BB=/tmp/dyn27b; BN=/tmp/dyn27n
( cmake -S $B -B $BB $F > $OUT/l/cfg_base.log 2>&1 && timeout 280 ninja -C $BB -j8 bench_cuda kvattn_cli > $OUT/l/build_base.log 2>&1; echo "base build rc=$?" ) &
( cmake -S $N -B $BN $F > $OUT/l/cfg_new.log 2>&1 && timeout 280 ninja -C $BN -j8 $T bench_cuda kvattn_cli > $OUT/l/build_new.log 2>&1; echo "new build rc=$?" ) &
wait
[ -x $BB/bench_cuda ] && [ -x $BN/bench_cuda ] || { echo "BUILD FAILED"; grep -a -E "error" $OUT/l/build_*.log | head -20; exit 1; }
echo "== built at $(el) s"
r() { # bin label args: one bench_cuda line, tagged; the graph time from its JSON
  local bin=$1 lab=$2; shift 2
  timeout 60 $bin "$@" 2> $OUT/l/e.txt > $OUT/l/o.txt
  local g=$(grep -ao '"graph_ms_per_layer": [0-9.]*' $OUT/l/o.txt | grep -o '[0-9.]*$')
  echo "$lab: $(grep -ao 'median [0-9.]* ms, [0-9.]* TB/s\|back to back [0-9.]* ms\|check [a-zA-Z]*' $OUT/l/e.txt | tr '\n' ' ')${g:+graph $g ms}" | tee -a $OUT/sum.txt
  grep -a "^bench_cuda:" $OUT/l/e.txt | sed "s/^/$lab /; s/\$/${g:+; graph $g ms per layer}/" >> $OUT/all.txt
}
copies() { r $BN/bench_cuda "$1-copy" --mode copy --iters 20
  for b in 67108864 134217728 268435456; do r $BN/bench_cuda "$1-copy$((b >> 20))" --mode copy --copy-bytes $b --iters 50; done; }
copies r1
S=("1 32767 8" "1 65535 8" "1 131071 8" "16 1023 0" "16 4095 0" "64 4095 0")
for rd in $(seq 1 ${KVA_ROUNDS:-2}); do for t in base new; do d=$BB; [ $t = new ] && d=$BN
  for s in "${S[@]}"; do set -- $s; g=(); [ $3 -gt 0 ] && g=(--graph-layers $3)
    r $d/bench_cuda "r$rd-$t ${1}x$(($2+1))" --mode decode --batch $1 --context $2 --iters 30 "${g[@]}"; done
  r $d/bench_cuda "r$rd-$t 64x4096 q8 G8" --mode decode --batch 64 --context 4088 --q-len 8 --heads 64 --kv-heads 8 --iters 30
  for qf in int8 fp8; do r $d/bench_cuda "r$rd-$t 64x4096 $qf" --mode decode --batch 64 --context 4095 --iters 30 --quant $qf; done
  for n in 4 2; do timeout 60 $d/kvattn bench --dcp $n --backend cuda --seq-len 131072 --batch 1 --iters 20 > $OUT/l/dcp.txt 2>&1
    echo "r$rd-$t dcp$n rc=$?: $(grep -aE 'unsharded|rank [0-9]' $OUT/l/dcp.txt | tr -s ' ' | tr '\n' ';')" | tee -a $OUT/sum.txt
    sed "s/^/r$rd-$t dcp$n /" $OUT/l/dcp.txt >> $OUT/all.txt; done
done; echo "== round $rd at $(el) s"; done
copies r2
echo "== tests at $(el) s"
run_tests() {
G=("test_grid,test_decode_mma" "test_split_kv,test_many_items,test_mma_mixed" "test_dcp_plans,test_chunk,test_stale_plan,test_empty_rows,test_force_kernel,test_ragged_refuses_paged_prefill")
for i in 0 1 2; do
  ( s=$(date +%s); KVA_TEST_ONLY=${G[$i]} KVA_TEST_QUICK=1 timeout 150 $BN/test_cuda_attn > $OUT/l/attn_$i.log 2>&1; echo "test_cuda_attn[$i] rc=$? $(( $(date +%s) - s )) s: $(grep -aE 'passed|FAILED|CHECK failed' $OUT/l/attn_$i.log | tail -1 | cut -c1-100)" ) &
done
( s=$(date +%s); KVA_TEST_ONLY=test_split_kv,test_many_items,test_decode_mma KVA_TEST_QUICK=1 timeout 160 compute-sanitizer --tool memcheck --error-exitcode 9 $BN/test_cuda_attn > $OUT/l/mc_attn.log 2>&1; echo "memcheck test_cuda_attn (decode cases) rc=$? $(( $(date +%s) - s )) s: $(grep -aE 'ERROR SUMMARY' $OUT/l/mc_attn.log | tail -1) $(grep -aE '[0-9]+ passed' $OUT/l/mc_attn.log | tail -1)" ) &
( s=$(date +%s); KVA_TEST_QUICK=1 timeout 160 compute-sanitizer --tool memcheck --error-exitcode 9 $BN/test_cuda_quant_attn > $OUT/l/mc_qattn.log 2>&1; echo "memcheck test_cuda_quant_attn rc=$? $(( $(date +%s) - s )) s: $(grep -aE 'ERROR SUMMARY' $OUT/l/mc_qattn.log | tail -1)" ) &
for t in ${T#test_cuda_attn }; do ( s=$(date +%s); KVA_TEST_QUICK=1 timeout 150 $BN/$t > $OUT/l/$t.log 2>&1; echo "$t rc=$? $(( $(date +%s) - s )) s: $(grep -aE 'passed|FAILED|CHECK failed' $OUT/l/$t.log | tail -1 | cut -c1-100)" ) & done
wait
}
run_tests 2>&1 | tee $OUT/tests.txt
echo "== tests done at $(el) s"
# The trace (dev only): instrument the trees (trace.py), rebuild bench_cuda (the decode objects and bench_cuda.c).
for t in ${KVA_TRACE_TREES:-base new}; do d=$B; [ $t = new ] && d=$N
  ( cd $d && python3 $N/dev/dyn27/trace.py . && timeout 200 ninja -C $([ $t = new ] && echo $BN || echo $BB) -j16 bench_cuda > $OUT/l/tbuild_$t.log 2>&1; echo "trace build $t rc=$?" ) &
done; wait
echo "== trace built at $(el) s"
for t in ${KVA_TRACE_TREES:-base new}; do d=$BB; [ $t = new ] && d=$BN
  for s in 32767 131071; do
    timeout 60 $d/bench_cuda --mode decode --batch 1 --context $s --iters 20 > $OUT/l/tr.txt 2>&1
    grep -a "dm_" $OUT/l/tr.txt | sed "s/^/$t 1x$((s+1)) /" | tee -a $OUT/trace.txt | grep -v "merge cta"
  done; done
echo "== trace done at $(el) s"
tar -czf $OUT/logs.tgz -C $OUT l
echo "== summary"; sed 's/ median / /; s/ back to back / b2b /' $OUT/sum.txt | cut -c1-200
echo "== end at $(el) s"
