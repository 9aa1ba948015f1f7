#!/usr/bin/env bash
# dev/pf37/ab.sh BASE NEW [V2] - issue 23 (pf37: the wgmma prefill's dynamic CTA-tile schedule)
# before/after in one device call, rerunnable by the lead on any GPU:
#   build  NEW (bench_cuda, test_cuda_prefill_mma, test_cuda_attn, pf_trace) first with every
#          core, then BASE and V2 (bench_cuda, pf_trace) while the tests run
#   tests  test_cuda_prefill_mma and test_cuda_attn (KVA_TEST_QUICK=1) and compute-sanitizer
#          memcheck of test_cuda_prefill_mma (quick), in parallel
#   bench  the prefill shapes of issue 23 (bench_cuda --mode prefill: per call median and back to
#          back, check against the CPU backend), base / new (/ v2 on the two short shapes)
#          alternated, ROUNDS rounds
#   trace  pf_trace 32 x 256 narrow and 8 x 1024 wide: base (static order), new and v2
#          (PF_SCHED=1)
#   sdpa   torch SDPA flash / cuDNN on the short shapes (bench/prefill_sdpa_peer.py short)
# Environment: OUT (logs), STEPS (default "build tests bench trace sdpa"), ROUNDS (default 2),
# V2_ALL=1 (V2 on every shape, not only 32 x 256 and 8 x 1024).
# At most ~8 files come back from a device call: logs.tgz holds the build and test logs.
set -u -o pipefail
OUT=${OUT:-pf37_ab}; mkdir -p "$OUT"
here=$(cd "$(dirname "$0")/../.." && pwd)
base=$(cd "$1" && pwd); new=$(cd "$2" && pwd); v2=""
[ $# -ge 3 ] && v2=$(cd "$3" && pwd)
steps=" ${STEPS:-build tests bench trace sdpa} "
has() { [[ "$steps" == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
CM=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a
    -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF -DKVA_WITH_CJSON=OFF -DKVA_BUILD_TESTS=ON)
hook=$(mktemp -d) # BASE's kernel header with the trace event 9 (pf_trace only)
sed 's/^\( *\)wg_epilogue<Ty, DV>(a, c, o, m_run, l_run);/\1KVA_WG_TRACE(9, tile_of(k), ntiles);\n&/' \
    "$base/src/attn/cuda/prefill_wgmma_kernel.cuh" > "$hook/prefill_wgmma_kernel.cuh"
build() { # tree, extra include dir ("" = no pf_trace), jobs, targets
    local t=$1 inc=$2 j=$3; shift 3
    cmake -S "$t" -B "$t/b" "${CM[@]}" && ninja -C "$t/b" -j"$j" kvattn_static "$@" || return 1
    [ -z "$inc" ] && return 0
    nvcc -O3 -std=c++17 -arch=sm_90a -DKVA_CUDA_SM90A=1 -DKVA_HAVE_CUDA=1 -diag-suppress 177 \
        -I"$inc" -I"$t/include" -I"$t/src/core" -I"$t/src/plan" -I"$t/src/attn/cuda" \
        "$here/dev/pf_trace/pf_trace.cu" "$t/b/libkvattn.a" -lgomp -lpthread -lm -o "$t/b/pf_trace"
}
SECONDS=0
tests_pid=""
if has build; then
    build "$new" "$new/src/attn/cuda" 16 bench_cuda test_cuda_prefill_mma test_cuda_attn \
        > "$OUT/build_new.log" 2>&1 || echo "BUILD FAILED new"
    echo "new built in $SECONDS s"
fi
if has tests; then
    (
        ( KVA_TEST_QUICK=1 timeout 240 "$new/b/test_cuda_prefill_mma" > "$OUT/test_prefill.log" 2>&1
          echo "test_cuda_prefill_mma quick: exit $?" ) &
        ( KVA_TEST_QUICK=1 timeout 240 "$new/b/test_cuda_attn" > "$OUT/test_attn.log" 2>&1
          echo "test_cuda_attn quick: exit $?" ) &
        ( KVA_TEST_QUICK=1 timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 \
            "$new/b/test_cuda_prefill_mma" > "$OUT/memcheck_prefill.log" 2>&1
          echo "memcheck test_cuda_prefill_mma quick: exit $? $(grep 'ERROR SUMMARY' "$OUT/memcheck_prefill.log" | tail -1)" ) &
        wait
        for f in "$OUT/test_prefill.log" "$OUT/test_attn.log"; do tail -n 3 "$f"; done
    ) > "$OUT/tests.txt" 2>&1 &
    tests_pid=$!
fi
if has build; then
    { build "$base" "$hook" 8 bench_cuda > "$OUT/build_base.log" 2>&1 || echo "BUILD FAILED base"; } &
    bpids=$!
    if [ -n "$v2" ]; then
        { build "$v2" "$v2/src/attn/cuda" 8 bench_cuda > "$OUT/build_v2.log" 2>&1 || echo "BUILD FAILED v2"; } &
        bpids="$bpids $!"
    fi
    wait $bpids
    echo "base/v2 built at $SECONDS s"
fi
[ -n "$tests_pid" ] && { wait "$tests_pid"; cat "$OUT/tests.txt"; echo "tests done at $SECONDS s"; }
if grep -q "exit 124" "$OUT/tests.txt" 2>/dev/null; then # a hung kernel: time no tree
    echo "a test timed out: no bench"; steps=" "
fi
if has bench; then
    shapes=("32 256 0 128" "8 1024 0 128" "2 2048 0 128" "1 4096 0 128" "4 1024 3072 128"
            "1 4096 0 64" "1 4096 0 256")
    for round in $(seq 1 "${ROUNDS:-2}"); do
        for s in "${shapes[@]}"; do
            read -r R Q C D <<< "$s"
            trees="base new"
            [ -n "$v2" ] && { [ -n "${V2_ALL:-}" ] ||
                { [ "$C" = 0 ] && [ "$D" = 128 ] && { [ "$Q" = 256 ] || [ "$Q" = 1024 ]; }; }; } &&
                trees="base new v2"
            for t in $trees; do
                d=$base; [ $t = new ] && d=$new; [ $t = v2 ] && d=$v2
                line=$(timeout 60 "$d/b/bench_cuda" --mode prefill --batch "$R" --q-len "$Q" --context "$C" \
                    --head-dim "$D" --iters 30 2>&1 >/dev/null | grep "^bench_cuda:" | head -1)
                echo "$t $line" >> "$OUT/bench_raw.log"
                echo "r$round $t ${R}x${Q}+${C} D$D $(echo "$line" | grep -oE 'median [0-9.]+ ms|[0-9.]+ TFLOP/s|check [a-zA-Z]+|back to back [0-9.]+ ms' | tr '\n' ' ')"
            done
        done
    done | tee "$OUT/bench.txt"
    echo "bench done at $SECONDS s"
fi
if has trace; then
    for s in "32 256 0 1" "8 1024 0 0"; do
        echo "== base (static order) $s"; timeout 60 "$base/b/pf_trace" $s 2>&1
        echo "== new (dynamic schedule) $s"; PF_SCHED=1 timeout 60 "$new/b/pf_trace" $s 2>&1
        if [ -n "$v2" ] && [ -x "$v2/b/pf_trace" ]; then
            echo "== v2 (PF_SCHED=1: its schedule, where it has one) $s"
            PF_SCHED=1 timeout 60 "$v2/b/pf_trace" $s 2>&1
        fi
    done | tee "$OUT/trace.txt"
fi
if has sdpa; then
    PYTHONUNBUFFERED=1 timeout 120 python3 "$here/bench/prefill_sdpa_peer.py" short 2>&1 | tee "$OUT/sdpa.txt"
fi
(cd "$OUT" && tar czf logs.tgz build_*.log test_*.log memcheck_*.log bench_raw.log 2>/dev/null &&
    rm -f build_*.log test_*.log memcheck_*.log bench_raw.log)
echo "total $SECONDS s"
