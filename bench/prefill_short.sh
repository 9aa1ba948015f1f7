#!/usr/bin/env bash
# prefill_short.sh - issue 23's short prefills on one GPU machine, in one call:
# builds bench_cuda (and the CUDA tests named in TESTS) for every source tree
# given, runs the quick tests, times the prefill shapes of a serving step with
# bench_cuda (per call, back to back, host enqueue, plan create), the torch SDPA
# peers on the same shapes (bench/prefill_sdpa_peer.py short), ncu on the
# 32 x 256 prefill (PROFILE=1) and serve-sim --backend cuda's plan share
# (SERVE=1). Logs go to $OUT.
# Usage: bench/prefill_short.sh NAME=SRCDIR [NAME=SRCDIR ...]
#   e.g. bench/prefill_short.sh base=/path/to/main new=.
# A SRCDIR that holds an executable bench_cuda is a prebuilt build directory
# (built elsewhere with the same CUDA toolkit; its tests too): it is used as is.
# Environment: TESTS (ctest names to build and run, quick sets), PROFILE,
# SERVE, SDPA=0 skips the peers, PS_SHAPES ("R Q C;R Q C": batch, q_len and
# cached keys of the shapes to time instead of the five), ARCH (default 90a),
# MORE=1 also times the other kernels the mask code serves on every tree (the mma.sync prefill
# forced, the int8 prefill, both after 4096 cached keys, bf16 decode and
# speculative decode), SOURCE=1 ncu's per-instruction stall samples
# (SourceCounters) of the 32 x 256 and 8 x 1024 prefills on every tree, as
# CSV (ncu --page source --print-source sass; SOURCE="base:32x256 new:8x1024"
# picks trees and shapes).
set -u -o pipefail
OUT=${OUT:-prefill_short_out}
mkdir -p "$OUT"
ARCH=${ARCH:-90a}
HERE=$(pwd)
TREES=("$@")
. scripts/device_deps.sh
EXTRA=(${KVA_DEP_ARGS[@]+"${KVA_DEP_ARGS[@]}"})
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"
SHAPES=("1 4096 0" "2 2048 0" "8 1024 0" "32 256 0" "4 1024 3072")
[ -n "${PS_SHAPES:-}" ] && IFS=';' read -ra SHAPES <<< "$PS_SHAPES"
TARGETS="bench_cuda"
[ "${SERVE:-0}" = 1 ] && TARGETS="$TARGETS kvattn"
# Configure and build every tree in parallel (16 cores shared).
for spec in "${TREES[@]}"; do
    name=${spec%%=*}; src=${spec#*=}
    if [ -x "$src/bench_cuda" ]; then
        rm -rf "$HERE/b-$name"; ln -s "$(cd "$src" && pwd)" "$HERE/b-$name"; continue
    fi
    ( cmake -S "$src" -B "$HERE/b-$name" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON \
        -DKVA_BUILD_TESTS=ON -DCMAKE_CUDA_ARCHITECTURES="$ARCH" "${EXTRA[@]}" \
        > "$OUT/build-$name.log" 2>&1 &&
      # The tests (TESTS) are built and run in the tree named new or exp only.
      t=$TARGETS; { [ "$name" = new ] || [ "$name" = exp ]; } && t="$t ${TESTS:-}"
      ninja -C "$HERE/b-$name" -j$(( $(nproc) / ${#TREES[@]} )) $t >> "$OUT/build-$name.log" 2>&1 ||
      { echo "BUILD FAILED: $name"; tail -30 "$OUT/build-$name.log"; } ) &
done
SECONDS=0; wait; echo "== built in ${SECONDS} s"
run_tests() {
    for spec in "${TREES[@]}"; do
        name=${spec%%=*}
        { [ "$name" = new ] || [ "$name" = exp ]; } || continue
        for t in ${TESTS:-}; do
            echo "== $name $t (quick)"
            KVA_TEST_QUICK=1 timeout "${TEST_LIMIT:-150}" "b-$name/$t" > "$OUT/test-$name-$t.log" 2>&1
            echo "exit $?"; tail -2 "$OUT/test-$name-$t.log"
        done
    done
}
for shp in "${SHAPES[@]}"; do
    set -- $shp
    for b in b-*/bench_cuda; do
        name=${b%%/*}; name=${name#b-}
        # VARIANTS (environment settings, one run each) apply to the tree
        # named "exp"; the others run once.
        vars="KVA_NONE=1"; [ "$name" = exp ] && vars=${VARIANTS:-KVA_NONE=1}
        for v in $vars; do
        echo -n "$name $v ${1}x${2}+${3}: "
        env ${v//,/ } timeout 120 "$b" --mode prefill --batch "$1" --q-len "$2" --context "$3" \
            --iters 50 --plan-iters 200 2> "$OUT/bench-$name-$1x$2.err" > /dev/null
        grep -o "median.*TFLOP/s, \|back to back.*\|host enqueue[^;]*\|plan create[^;]*us\|check [a-zA-Z]*" \
            "$OUT/bench-$name-$1x$2.err" | tr '\n' ' '; echo
        done
    done
done | tee "$OUT/bench.txt"
if [ "${MORE:-0}" = 1 ]; then
    MORE_RUNS=("prefill_mma_sm80 8x1024+4096|--mode prefill --batch 8 --q-len 1024 --kernel prefill_mma_sm80"
        "prefill_mma_sm80 32x256+4096|--mode prefill --batch 32 --q-len 256 --kernel prefill_mma_sm80"
        "prefill int8 8x1024+4096|--mode prefill --batch 8 --q-len 1024 --quant int8"
        "prefill int8 32x256+4096|--mode prefill --batch 32 --q-len 256 --quant int8"
        "decode 64x4096|--mode decode --batch 64 --context 4096"
        "decode q4 16x4096|--mode decode --batch 16 --q-len 4 --context 4096"
        "decode int8 q4 16x4096|--mode decode --batch 16 --q-len 4 --context 4096 --quant int8")
    for m in "${MORE_RUNS[@]}"; do
        for b in b-*/bench_cuda; do
            name=${b%%/*}; name=${name#b-}
            echo -n "$name ${m%%|*}: "
            timeout 120 "$b" ${m#*|} --iters 50 2> "$OUT/more-$name.err" > /dev/null
            grep -o "median[^,]*, [^,]*, [^,]*, \|check [a-zA-Z]*" "$OUT/more-$name.err" | tr '\n' ' '; echo
        done
    done | tee "$OUT/more.txt"
fi
if [ "${PROFILE:-0}" = 1 ]; then
    for b in b-*/bench_cuda; do
        name=${b%%/*}; name=${name#b-}
        for shp in "32 256" "8 1024"; do
            set -- $shp
            timeout 120 ncu -k regex:prefill_wgmma -s 2 -c 1 --section SpeedOfLight \
                --section Occupancy --section LaunchStats --section WarpStateStats \
                --section SchedulerStats --section MemoryWorkloadAnalysis \
                --metrics sm__cycles_active.max,sm__cycles_active.avg,sm__cycles_active.min \
                "$b" --mode prefill --batch "$1" --q-len "$2" --context 0 --iters 3 \
                > "$OUT/ncu-$name-$1x$2.txt" 2>&1
            echo "== ncu $name $1x$2"
            grep -E "Duration|SM Busy|Throughput|Issue Slots|Eligible|Active Warps|Stall|Achieved Occ|Grid Size|sm__cycles|Waves|L2 Hit|Mem Busy|Max Bandwidth" \
                "$OUT/ncu-$name-$1x$2.txt" | head -30
        done
    done
fi
if [ -n "${SOURCE:-}" ] && [ "${SOURCE}" != 0 ]; then
    # SOURCE=1: every tree and both shapes; else "NAME:RxQ ..." pairs.
    pairs=${SOURCE}
    if [ "$pairs" = 1 ]; then
        pairs=""
        for b in b-*/bench_cuda; do n=${b%%/*}; pairs="$pairs ${n#b-}:32x256 ${n#b-}:8x1024"; done
    fi
    for pr in $pairs; do
        name=${pr%%:*}; shp=${pr#*:}; b="b-$name/bench_cuda"
        {
            set -- ${shp%x*} ${shp#*x}
            timeout 120 ncu -k regex:prefill_wgmma -s 2 -c 1 --section WarpStateStats \
                --section SourceCounters --section SpeedOfLight -f -o "$OUT/src-$name-$1x$2" \
                "$b" --mode prefill --batch "$1" --q-len "$2" --context 0 --iters 3 \
                > "$OUT/src-$name-$1x$2.log" 2>&1
            timeout 60 ncu -i "$OUT/src-$name-$1x$2.ncu-rep" --page source --csv \
                --print-source sass > "$OUT/src-$name-$1x$2.csv" 2>&1 ||
                timeout 60 ncu -i "$OUT/src-$name-$1x$2.ncu-rep" --page source --csv \
                    > "$OUT/src-$name-$1x$2.csv" 2>&1
            echo "== source counters $name $1x$2: $(wc -l < "$OUT/src-$name-$1x$2.csv") lines"
        }
    done
fi
if [ "${STALLS:-0}" = 1 ]; then
    # Stall reasons per issued instruction of the 32 x 256 prefill kernel, every tree.
    for b in b-*/bench_cuda; do
        name=${b%%/*}; name=${name#b-}
        timeout 100 ncu -k regex:prefill_wgmma -s 2 -c 1 \
            --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,gpu__time_duration.sum" \
            "$b" --mode prefill --batch 32 --q-len 256 --context 0 --iters 3 \
            > "$OUT/stalls-$name.txt" 2>&1
        echo "== stalls $name 32x256"
        grep -E "stalled|duration" "$OUT/stalls-$name.txt" | awk '$NF+0 > 0.05' | sed 's/smsp__average_warps_issue_stalled_//' | head -14
    done
fi
if [ "${SERVE:-0}" = 1 ]; then
    for s in "${TREES[@]}"; do
        name=${s%%=*}
        echo "== serve-sim $name"
        timeout 120 "b-$name/kvattn" serve-sim --backend cuda > "$OUT/serve-$name.txt" 2>&1
        grep -i "plan\|step time\|throughput" "$OUT/serve-$name.txt" | head -8
    done
fi
if [ "${SDPA:-1}" = 1 ]; then
    echo "== torch SDPA (same shapes, contiguous K/V expanded to H heads)"
    PYTHONUNBUFFERED=1 timeout 200 python3 "$HERE/bench/prefill_sdpa_peer.py" short 2>&1 | tee "$OUT/sdpa.txt"
fi
run_tests
