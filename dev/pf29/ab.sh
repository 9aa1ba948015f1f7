#!/usr/bin/env bash
# dev/pf29/ab.sh BASE NEW - issue 23 (pf29) before/after in one device call, rerunnable by the
# lead: builds bench_cuda of both trees (90a; the tests in NEW) and pf_trace (this tree's
# dev/pf_trace/pf_trace.cu against each tree's kernel header; BASE's header gets the trace hook's
# event 9, "next Q issued", which the library leaves empty), then
#   bench  the prefill shapes of issue 23, base and new alternated twice (bench_cuda --mode
#          prefill: per call median and back to back, check against the CPU backend)
#   trace  pf_trace 32 x 256 narrow and 8 x 1024 wide, base and new (phases per CTA tile)
#   sdpa   torch SDPA flash / cuDNN on the short shapes (bench/prefill_sdpa_peer.py short)
#   tests  test_cuda_prefill_mma and test_cuda_attn (KVA_TEST_QUICK=1) and compute-sanitizer
#          memcheck of test_cuda_prefill_mma (quick), in parallel, last (timings done)
# Environment: OUT (logs), STEPS (default "bench trace sdpa tests").
set -u -o pipefail
OUT=${OUT:-pf29_ab}; mkdir -p "$OUT"
here=$(cd "$(dirname "$0")/../.." && pwd)
base=$(cd "$1" && pwd); new=$(cd "$2" && pwd)
steps=" ${STEPS:-bench trace sdpa tests} "
has() { [[ "$steps" == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
CM=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a
    -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF -DKVA_WITH_CJSON=OFF -DKVA_BUILD_TESTS=ON)
hook=$(mktemp -d) # BASE's kernel header with the trace event 9 (pf_trace only)
sed 's/^\( *\)wg_epilogue<Ty, DV>(a, c, o, m_run, l_run);/\1KVA_WG_TRACE(9, tile_of(k), ntiles);\n&/' \
    "$base/src/attn/cuda/prefill_wgmma_kernel.cuh" > "$hook/prefill_wgmma_kernel.cuh"
build() { # tree, extra include dir, targets
    local t=$1 inc=$2; shift 2
    cmake -S "$t" -B "$t/b" "${CM[@]}" && ninja -C "$t/b" -j8 kvattn_static "$@" &&
    nvcc -O3 -std=c++17 -arch=sm_90a -DKVA_CUDA_SM90A=1 -DKVA_HAVE_CUDA=1 -diag-suppress 177 \
        -I"$inc" -I"$t/include" -I"$t/src/core" -I"$t/src/plan" -I"$t/src/attn/cuda" \
        "$here/dev/pf_trace/pf_trace.cu" "$t/b/libkvattn.a" -lgomp -lpthread -lm -o "$t/b/pf_trace"
}
SECONDS=0
build "$base" "$hook" bench_cuda > "$OUT/build_base.log" 2>&1 || echo "BUILD FAILED base" &
build "$new" "$new/src/attn/cuda" bench_cuda test_cuda_prefill_mma test_cuda_attn \
    > "$OUT/build_new.log" 2>&1 || echo "BUILD FAILED new" &
wait; echo "built in $SECONDS s"
if has bench; then
    shapes=("32 256 0 128" "8 1024 0 128" "2 2048 0 128" "1 4096 0 128" "4 1024 3072 128"
            "1 4096 0 64" "1 4096 0 256")
    for round in 1 2; do
        for s in "${shapes[@]}"; do
            read -r R Q C D <<< "$s"
            for t in base new; do
                d=$base; [ $t = new ] && d=$new
                line=$("$d/b/bench_cuda" --mode prefill --batch "$R" --q-len "$Q" --context "$C" \
                    --head-dim "$D" --iters 30 2>&1 >/dev/null | grep "^bench_cuda:" | head -1)
                echo "$line" >> "$OUT/bench_raw.log"
                echo "r$round $t ${R}x${Q}+${C} D$D $(echo "$line" | grep -oE 'median [0-9.]+ ms|[0-9.]+ TFLOP/s|check [a-zA-Z]+|back to back [0-9.]+ ms' | tr '\n' ' ')"
            done
        done
    done | tee "$OUT/bench.txt"
fi
if has trace; then
    for s in "32 256 0 1" "8 1024 0 0"; do
        for t in base new; do
            d=$base; [ $t = new ] && d=$new
            echo "== $t $s"; "$d/b/pf_trace" $s 2>&1
        done
    done | tee "$OUT/trace.txt"
fi
if has sdpa; then
    PYTHONUNBUFFERED=1 timeout 120 python3 "$here/bench/prefill_sdpa_peer.py" short 2>&1 | tee "$OUT/sdpa.txt"
fi
if has tests; then
    ( KVA_TEST_QUICK=1 timeout 220 "$new/b/test_cuda_prefill_mma" > "$OUT/test_prefill.log" 2>&1
      echo "test_cuda_prefill_mma quick: exit $?" ) &
    ( KVA_TEST_QUICK=1 timeout 220 "$new/b/test_cuda_attn" > "$OUT/test_attn.log" 2>&1
      echo "test_cuda_attn quick: exit $?" ) &
    ( KVA_TEST_QUICK=1 timeout 220 compute-sanitizer --tool memcheck --error-exitcode 9 \
        "$new/b/test_cuda_prefill_mma" > "$OUT/memcheck_prefill.log" 2>&1
      echo "memcheck test_cuda_prefill_mma quick: exit $? $(grep 'ERROR SUMMARY' "$OUT/memcheck_prefill.log" | tail -1)" ) &
    wait
    for f in "$OUT/test_prefill.log" "$OUT/test_attn.log"; do tail -n 3 "$f"; done
fi
# At most ~8 files come back from a device call: the build and test logs go into one archive.
(cd "$OUT" && tar czf logs.tgz build_*.log test_*.log memcheck_*.log 2>/dev/null &&
    rm -f build_*.log test_*.log memcheck_*.log)
echo "total $SECONDS s"
