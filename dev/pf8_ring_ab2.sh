#!/usr/bin/env bash
# pf8_ring_ab2.sh - issue 23 experiment (branch pf8), second call (ran at 8dc79fd; the KVA_PF8_EXP
# variants were removed after it): pf8_ring_ab.sh without the
# base tree (main's narrow kernel is the KVA_PF8_EXP=1 instantiation of the same binary: ring 2,
# INTRA) and without the SDPA peers, to fit the call into what is left of the device share.
# Run from the folder holding new/. Forms: new (plan's choice: narrow ring 3 INTRA at 32x256),
# n1 / n2 / n3 (KVA_PF8_EXP: ring 2 INTRA = main's, ring 2 no INTRA, ring 3 no INTRA), "f" suffix:
# narrow forced. Logs under $OUT/l.
set -u -o pipefail
OUT=${OUT:-out}; mkdir -p "$OUT/l"; t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/l/gpu.txt"
T="test_cuda_prefill_mma test_cuda_attn"
cmake -S new -B bn -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DKVA_BUILD_TESTS=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF \
    -DKVA_WITH_CJSON=OFF > "$OUT/l/cfg.log" 2>&1
timeout 100 ninja -C bn -j16 bench_cuda $T > "$OUT/l/build.log" 2>&1 ||
    { echo "BUILD FAILED"; grep -m10 -A4 "error" "$OUT/l/build.log"; tar -czf "$OUT/logs.tgz" -C "$OUT" l; exit 1; }
echo "== built at $(el) s"
for t in $T; do
    ( KVA_TEST_QUICK=1 timeout 40 "bn/$t" > "$OUT/l/$t.log" 2>&1
      echo "$t rc=$? $(grep -E 'passed|FAILED|CHECK' "$OUT/l/$t.log" | tail -1 | cut -c1-110)" ) &
done
wait
echo "== tests done at $(el) s"
NK=(--kernel prefill_wgmma_tma_narrow_sm90)
run() { # label shape(R Q C) env... [-- kernel args]
    local lab=$1 R=$2 Q=$3 C=$4; shift 4
    local envs=() k=()
    while [ $# -gt 0 ]; do [ "$1" = -- ] && { shift; k=("$@"); break; }; envs+=("$1"); shift; done
    echo -n "r$rnd $lab ${R}x${Q}+${C}: "
    env KVA_NONE=1 ${envs[@]+"${envs[@]}"} timeout 30 bn/bench_cuda --mode prefill --batch "$R" \
        --q-len "$Q" --context "$C" --iters 50 ${k[@]+"${k[@]}"} 2> "$OUT/l/b-$rnd-$lab-${R}x${Q}.err" > /dev/null
    grep -o "median.*TFLOP/s, \|back to back.*\|check [a-zA-Z]*" "$OUT/l/b-$rnd-$lab-${R}x${Q}.err" | tr '\n' ' '; echo
}
for rnd in 1 2; do
    run n1 32 256 0 KVA_PF8_EXP=1; run new 32 256 0; run n2 32 256 0 KVA_PF8_EXP=2
    run n3 32 256 0 KVA_PF8_EXP=3
    [ "$rnd" = 2 ] && break
    run new 8 1024 0; run n0f 8 1024 0 -- "${NK[@]}"; run n1f 8 1024 0 KVA_PF8_EXP=1 -- "${NK[@]}"
    run n3f 8 1024 0 KVA_PF8_EXP=3 -- "${NK[@]}"
    run n0f 1 4096 0 -- "${NK[@]}"; run n1f 1 4096 0 KVA_PF8_EXP=1 -- "${NK[@]}"
    [ "$(el)" -gt "${LIM:-105}" ] && { echo "== time limit"; break; }
done | tee "$OUT/l/bench.txt"
echo "== bench done at $(el) s"
if [ "$(el)" -lt "${MC_LIM:-110}" ]; then
    KVA_TEST_QUICK=1 timeout 30 compute-sanitizer --tool memcheck bn/test_cuda_prefill_mma \
        > "$OUT/l/memcheck.log" 2>&1
    echo "memcheck test_cuda_prefill_mma rc=$? $(grep 'ERROR SUMMARY' "$OUT/l/memcheck.log" | tail -1)"
fi
tar -czf "$OUT/logs.tgz" -C "$OUT" l
echo "== end at $(el) s"
