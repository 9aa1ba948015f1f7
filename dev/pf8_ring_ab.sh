#!/usr/bin/env bash
# pf8_ring_ab.sh - issue 23 experiment (branch pf8; ran at 307b12c, whose KVA_PF8_EXP variants lived
# in src/attn/cuda/prefill_wgmma_d128x.cu, removed after the calls): the narrow wgmma prefill's K/V ring depth
# and P V placement, against main, in one device call. Run from the folder holding base/ (main)
# and new/ (pf8): builds both (bench_cuda; new also the tests), runs new's tests (quick) and
# memcheck of test_cuda_prefill_mma (quick), then times per shape, alternated, ROUNDS rounds:
#   base      main's bench_cuda, the plan's choice
#   new       pf8's bench_cuda, the plan's choice (narrow: ring 3, INTRA)
#   nN        pf8 with KVA_PF8_EXP=N (narrow variants, prefill_wgmma_d128x.cu): 1 ring 2 INTRA
#             (main's), 2 ring 2 no INTRA, 3 ring 3 no INTRA; "f" suffix: narrow forced
#   wide      pf8 with the wide shape forced
# then the SDPA peers (bench/prefill_sdpa_peer.py short). Logs under $OUT/l.
set -u -o pipefail
OUT=${OUT:-out}; mkdir -p "$OUT/l"; t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/l/gpu.txt"
T="test_cuda_prefill_mma test_cuda_attn test_cuda_tree"
CF=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DKVA_BUILD_TESTS=ON
    -DCMAKE_CUDA_ARCHITECTURES=90a -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF -DKVA_WITH_CJSON=OFF)
( cmake -S base -B bb "${CF[@]}" > "$OUT/l/cfg-base.log" 2>&1 &&
  timeout 240 ninja -C bb -j6 bench_cuda > "$OUT/l/build-base.log" 2>&1 || echo "BASE BUILD FAILED" ) &
( cmake -S new -B bn "${CF[@]}" > "$OUT/l/cfg-new.log" 2>&1 &&
  timeout 240 ninja -C bn -j10 bench_cuda $T > "$OUT/l/build-new.log" 2>&1 ||
  { echo "NEW BUILD FAILED"; grep -m10 -A4 "error" "$OUT/l/build-new.log"; } ) &
wait
echo "== built at $(el) s"
[ -x bn/bench_cuda ] || { tar -czf "$OUT/logs.tgz" -C "$OUT" l; exit 1; }
for t in $T; do
    ( KVA_TEST_QUICK=1 timeout 120 "bn/$t" > "$OUT/l/$t.log" 2>&1
      echo "$t rc=$? $(grep -E 'passed|FAILED|CHECK' "$OUT/l/$t.log" | tail -1 | cut -c1-110)" ) &
done
( KVA_TEST_QUICK=1 timeout 120 compute-sanitizer --tool memcheck bn/test_cuda_prefill_mma \
    > "$OUT/l/memcheck.log" 2>&1
  echo "memcheck test_cuda_prefill_mma rc=$? $(grep 'ERROR SUMMARY' "$OUT/l/memcheck.log" | tail -1)" ) &
wait
echo "== tests done at $(el) s"
NK=(--kernel prefill_wgmma_tma_narrow_sm90)
run() { # label binary shape(R Q C) env... [-- kernel args]
    local lab=$1 b=$2 R=$3 Q=$4 C=$5; shift 5
    local envs=() k=()
    while [ $# -gt 0 ]; do [ "$1" = -- ] && { shift; k=("$@"); break; }; envs+=("$1"); shift; done
    echo -n "r$rnd $lab ${R}x${Q}+${C}: "
    env KVA_NONE=1 ${envs[@]+"${envs[@]}"} timeout 60 "$b/bench_cuda" --mode prefill --batch "$R" \
        --q-len "$Q" --context "$C" --iters 50 ${k[@]+"${k[@]}"} 2> "$OUT/l/b-$rnd-$lab-${R}x${Q}.err" > /dev/null
    grep -o "median.*TFLOP/s, \|back to back.*\|check [a-zA-Z]*" "$OUT/l/b-$rnd-$lab-${R}x${Q}.err" | tr '\n' ' '; echo
}
LIM=${LIM:-200}
for rnd in $(seq 1 "${ROUNDS:-2}"); do
    run base bb 32 256 0; run new bn 32 256 0; run n1 bn 32 256 0 KVA_PF8_EXP=1
    run n2 bn 32 256 0 KVA_PF8_EXP=2; run n3 bn 32 256 0 KVA_PF8_EXP=3
    run wide bn 32 256 0 -- --kernel prefill_wgmma_tma_sm90
    run base bb 8 1024 0; run new bn 8 1024 0
    run n0f bn 8 1024 0 -- "${NK[@]}"; run n1f bn 8 1024 0 KVA_PF8_EXP=1 -- "${NK[@]}"
    run n3f bn 8 1024 0 KVA_PF8_EXP=3 -- "${NK[@]}"
    [ "$(el)" -gt "$LIM" ] && { echo "== time limit"; break; }
    [ "$rnd" -gt 1 ] && continue
    run base bb 1 4096 0; run new bn 1 4096 0
    run n0f bn 1 4096 0 -- "${NK[@]}"; run n1f bn 1 4096 0 KVA_PF8_EXP=1 -- "${NK[@]}"
    run base bb 2 2048 0; run new bn 2 2048 0; run base bb 4 1024 3072; run new bn 4 1024 3072
done | tee "$OUT/l/bench.txt"
echo "== bench done at $(el) s"
if [ "${SDPA:-1}" = 1 ] && [ "$(el)" -lt "${SDPA_LIM:-215}" ]; then
    PYTHONUNBUFFERED=1 timeout 60 python3 new/bench/prefill_sdpa_peer.py short > "$OUT/l/sdpa.txt" 2>&1
    echo "sdpa rc=$?"; grep -v Traceback "$OUT/l/sdpa.txt" | tail -12
fi
if [ "${NCU:-1}" = 1 ] && [ "$(el)" -lt "${NCU_LIM:-225}" ]; then
    # What the new 32x256 kernel's warps wait on (stall reasons per issued instruction).
    timeout 40 ncu -k regex:prefill_wgmma -s 2 -c 1 --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats --section SchedulerStats \
        --metrics sm__cycles_active.max,sm__cycles_active.avg,sm__cycles_active.min \
        bn/bench_cuda --mode prefill --batch 32 --q-len 256 --context 0 --iters 3 \
        > "$OUT/l/ncu-new-32x256.txt" 2>&1
    echo "ncu rc=$?"; grep -E "Duration|Issue Slots|Eligible|Active Warps|Stall|Achieved Occ|Grid|sm__cycles|Registers|Waves" \
        "$OUT/l/ncu-new-32x256.txt" | head -24
fi
tar -czf "$OUT/logs.tgz" -C "$OUT" l
echo "== end at $(el) s"
