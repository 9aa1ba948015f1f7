#!/usr/bin/env bash
# prefill_shape_ab.sh - issue 23, the wgmma prefill's tile shapes on one GPU machine in one call:
# builds bench_cuda and the prefill-path CUDA tests of this tree (TESTS), runs the tests (quick sets,
# concurrently) and compute-sanitizer memcheck on test_cuda_prefill_mma (quick), then times each
# prefill shape with bench_cuda in three forms of the one binary, alternated per shape, ROUNDS times:
#   wide = --kernel prefill_wgmma_tma_sm90 (the wide tile shape forced: main's kernel),
#   auto = the plan's choice (narrow where every prefill has q_len <= the plan's limit),
#   nar  = --kernel prefill_wgmma_tma_narrow_sm90 (the narrow shape forced),
# then the SDPA peers (bench/prefill_sdpa_peer.py short) on the same shapes. Logs under $OUT.
# Usage (repository root on the GPU machine): bash bench/prefill_shape_ab.sh
# Environment: ROUNDS (2), TESTS, AB_SHAPES ("R Q C;R Q C": batch, q_len and cached keys of the
# shapes to time instead of the five), NAR_SHAPES (shapes that also run "nar", e.g. "32x256
# 8x1024"; default all), SDPA=0, MEMCHECK=0.
set -u -o pipefail
OUT=${OUT:-out}; mkdir -p "$OUT/l"; t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/l/gpu.txt"
T=${TESTS-test_cuda_prefill_mma test_cuda_tree test_cuda_graph test_cuda_cascade test_cuda_attn}
cmake -S . -B bn -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DKVA_BUILD_TESTS=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF \
    -DKVA_WITH_CJSON=OFF > "$OUT/l/cfg.log" 2>&1
timeout 300 ninja -C bn -j16 bench_cuda $T > "$OUT/l/build.log" 2>&1 ||
    { echo "BUILD FAILED"; grep -m10 -A4 "error" "$OUT/l/build.log"; tar -czf "$OUT/logs.tgz" -C "$OUT" l; exit 1; }
echo "== built at $(el) s"
for t in $T; do
    ( KVA_TEST_QUICK=1 timeout 150 "bn/$t" > "$OUT/l/$t.log" 2>&1
      echo "$t rc=$? $(grep -E 'passed|FAILED|CHECK' "$OUT/l/$t.log" | tail -1 | cut -c1-110)" ) &
done
[ "${MEMCHECK:-1}" = 1 ] &&
( KVA_TEST_QUICK=1 timeout 170 compute-sanitizer --tool memcheck bn/test_cuda_prefill_mma \
    > "$OUT/l/memcheck.log" 2>&1
  echo "memcheck test_cuda_prefill_mma rc=$? $(grep 'ERROR SUMMARY' "$OUT/l/memcheck.log" | tail -1)" ) &
wait
echo "== tests done at $(el) s"
SHAPES=("1 4096 0" "2 2048 0" "8 1024 0" "32 256 0" "4 1024 3072")
[ -n "${AB_SHAPES:-}" ] && IFS=';' read -ra SHAPES <<< "$AB_SHAPES"
NAR=${NAR_SHAPES:-all}
for r in $(seq 1 "${ROUNDS:-2}"); do
    for shp in "${SHAPES[@]}"; do
        set -- $shp
        forms="wide auto"
        { [ "$NAR" = all ] || [[ " $NAR " == *" ${1}x${2} "* ]]; } && forms="$forms nar"
        for f in $forms; do
            k=(); [ $f = wide ] && k=(--kernel prefill_wgmma_tma_sm90)
            [ $f = nar ] && k=(--kernel prefill_wgmma_tma_narrow_sm90)
            echo -n "r$r $f ${1}x${2}+${3}: "
            timeout 60 bn/bench_cuda --mode prefill --batch "$1" --q-len "$2" --context "$3" \
                --iters 50 "${k[@]}" 2> "$OUT/l/b-$r-$f-$1x$2.err" > /dev/null
            grep -o "median.*TFLOP/s, \|back to back.*\|check [a-zA-Z]*" "$OUT/l/b-$r-$f-$1x$2.err" |
                tr '\n' ' '; echo
        done
    done
done | tee "$OUT/l/bench.txt"
echo "== bench done at $(el) s"
if [ "${SDPA:-1}" = 1 ]; then
    PYTHONUNBUFFERED=1 timeout 100 python3 bench/prefill_sdpa_peer.py short > "$OUT/l/sdpa.txt" 2>&1
    echo "sdpa rc=$?"; grep -v Traceback "$OUT/l/sdpa.txt" | tail -14
fi
tar -czf "$OUT/logs.tgz" -C "$OUT" l
echo "== end at $(el) s"
