#!/usr/bin/env bash
# dev/dcp28/ab.sh - issue 19/20/23: the one-request decode's fixed cost, main against a branch, one GPU call.
# From a folder holding the two source trees: OUT=DIR bash new/dev/dcp28/ab.sh base new
#   1) build both (90a; new also the CUDA tests it touches);
#   2) device copies of 1 GiB and 64 / 128 / 256 MiB (read + write = the KV bytes of a 4-way and a 2-way
#      shard of 1 x 128k and of the unsharded 1 x 128k): the ceilings per call;
#   3) rows alternated (base, new, base, new): `kvattn bench --dcp 4|2 --backend cuda` at 128k R 1 (per call,
#      slowest rank / unsharded), bench_cuda R 1 at 32k and 128k (per call, back to back, graph of 8 layers),
#      16 x 1k, 16 x 4k, 64 x 4k bf16, int8 64 x 4k; round 1 also --dcp 4 at R 8;
#   4) tests of the new tree (quick) and compute-sanitizer memcheck of test_cuda_attn's decode cases;
#   5) dev/dcp28/trace.py on both trees, bench_cuda rebuilt, R 1 at 32k and 128k: per CTA %globaltimer stamps.
# Lines: $OUT/all.txt (every bench_cuda / dcp line, tagged rN-base|rN-new), $OUT/sum.txt, $OUT/tests.txt,
# $OUT/trace.txt, as they come. KVA_ROUNDS (default 2); KVA_S (rows "R S-1 graph-layers" comma-separated),
# KVA_DCP_NS (default "4 2"), KVA_INT8=0, KVA_R8=0, KVA_COPIES2=0, KVA_TRACE=0 leave parts out; KVA_R8_NS (default 4):
# the N of round 1's R 8 rows; KVA_TRACE_TREES (default "base new"; "mid" traces a third tree beside new/, e.g. a
# branch's earlier commit).
set -u -o pipefail
B=$(cd "$1" && pwd); N=$(cd "$2" && pwd)
OUT=${OUT:-out}; mkdir -p $OUT/l; t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader | tee $OUT/l/gpu.txt
echo "# gpu: $(cat $OUT/l/gpu.txt)" > $OUT/all.txt
T="test_cuda_attn test_cuda_quant_attn test_cuda_dcp test_cuda_plan_update"
F="-G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DKVA_BUILD_TESTS=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF -DKVA_WITH_CJSON=OFF -DKVA_WITH_MPI=OFF -DKVA_WITH_NCCL=OFF"
BB=/tmp/dcp28b; BN=/tmp/dcp28n
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
dcp() { # tree dir n R
  timeout 90 $2/kvattn bench --dcp $3 --backend cuda --seq-len 131072 --batch $4 --iters 20 > $OUT/l/dcp.txt 2>&1
  echo "$1 dcp$3 R$4 rc=$?: $(grep -aE 'unsharded|rank [0-9]' $OUT/l/dcp.txt | tr -s ' ' | tr '\n' ';')" | tee -a $OUT/sum.txt
  sed "s/^/$1 dcp$3 R$4 /" $OUT/l/dcp.txt >> $OUT/all.txt; }
copies r1
S=("1 32767 8" "1 131071 8" "16 1023 0" "16 4095 0" "64 4095 0")
[ -n "${KVA_S:-}" ] && IFS=, read -r -a S <<< "$KVA_S"
for rd in $(seq 1 ${KVA_ROUNDS:-2}); do for t in base new; do d=$BB; [ $t = new ] && d=$BN
  for n in ${KVA_DCP_NS:-4 2}; do dcp r$rd-$t $d $n 1; done
  for s in "${S[@]}"; do set -- $s; g=(); [ $3 -gt 0 ] && g=(--graph-layers $3)
    r $d/bench_cuda "r$rd-$t ${1}x$(($2+1))" --mode decode --batch $1 --context $2 --iters 30 "${g[@]}"; done
  [ "${KVA_INT8:-1}" = 1 ] && r $d/bench_cuda "r$rd-$t 64x4096 int8" --mode decode --batch 64 --context 4095 --iters 30 --quant int8
  [ $rd = 1 ] && [ "${KVA_R8:-1}" = 1 ] && for n in ${KVA_R8_NS:-4}; do dcp r$rd-$t $d $n 8; done
done; echo "== round $rd at $(el) s"; done
[ "${KVA_COPIES2:-1}" = 1 ] && copies r2
echo "== tests at $(el) s"
run_tests() {
G=("test_grid,test_decode_mma" "test_split_kv,test_many_items,test_mma_mixed" "test_dcp_plans,test_chunk,test_stale_plan,test_empty_rows,test_force_kernel,test_ragged_refuses_paged_prefill")
for i in ${KVA_TEST_GROUPS:-0 1 2}; do
  ( s=$(date +%s); KVA_TEST_ONLY=${G[$i]} KVA_TEST_QUICK=1 timeout 150 $BN/test_cuda_attn > $OUT/l/attn_$i.log 2>&1; echo "test_cuda_attn[$i] rc=$? $(( $(date +%s) - s )) s: $(grep -aE 'passed|FAILED|CHECK failed' $OUT/l/attn_$i.log | tail -1 | cut -c1-100)" ) &
done
( s=$(date +%s); KVA_TEST_ONLY=test_split_kv,test_many_items,test_decode_mma KVA_TEST_QUICK=1 timeout 160 compute-sanitizer --tool memcheck --error-exitcode 9 $BN/test_cuda_attn > $OUT/l/mc_attn.log 2>&1; echo "memcheck test_cuda_attn (decode cases) rc=$? $(( $(date +%s) - s )) s: $(grep -aE 'ERROR SUMMARY' $OUT/l/mc_attn.log | tail -1) $(grep -aE '[0-9]+ passed' $OUT/l/mc_attn.log | tail -1)" ) &
for t in ${T#test_cuda_attn }; do ( s=$(date +%s); KVA_TEST_QUICK=1 timeout 150 $BN/$t > $OUT/l/$t.log 2>&1; echo "$t rc=$? $(( $(date +%s) - s )) s: $(grep -aE 'passed|FAILED|CHECK failed' $OUT/l/$t.log | tail -1 | cut -c1-100)" ) & done
wait
}
KT=${KVA_TRACE:-1}
# The trace trees are instrumented copies built beside the tests (CPU), so the tests' binaries stay as built.
for t in ${KVA_TRACE_TREES:-base new}; do [ $KT = 1 ] || break; d=$B; [ $t = new ] && d=$N; [ $t = mid ] && d=$(cd $N/../mid && pwd)
  ( rm -rf /tmp/dcp28tr_$t && cp -r $d /tmp/dcp28tr_$t && python3 $N/dev/dcp28/trace.py /tmp/dcp28tr_$t > /dev/null && cmake -S /tmp/dcp28tr_$t -B /tmp/dcp28trb_$t $F > /dev/null 2>&1 && timeout 240 ninja -C /tmp/dcp28trb_$t -j6 bench_cuda > $OUT/l/tbuild_$t.log 2>&1; echo "trace build $t rc=$?" > $OUT/l/tb_$t.txt ) &
done
run_tests 2>&1 | tee $OUT/tests.txt
echo "== tests done at $(el) s"
wait; cat $OUT/l/tb_*.txt 2>/dev/null
echo "== trace built at $(el) s"
for t in ${KVA_TRACE_TREES:-base new}; do [ $KT = 1 ] || break; d=/tmp/dcp28trb_$t
  for s in 32767 131071; do
    timeout 60 $d/bench_cuda --mode decode --batch 1 --context $s --iters 20 > $OUT/l/tr.txt 2>&1
    grep -a "dm_" $OUT/l/tr.txt | sed "s/^/$t 1x$((s+1)) /" | tee -a $OUT/trace.txt | grep -v "merge cta\|help cta"
  done; done
echo "== trace done at $(el) s"
tar -czf $OUT/logs.tgz -C $OUT l
echo "== summary"; sed 's/ median / /; s/ back to back / b2b /' $OUT/sum.txt | cut -c1-220
echo "== end at $(el) s"
