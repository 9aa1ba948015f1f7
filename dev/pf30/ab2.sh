#!/usr/bin/env bash
# dev/pf30/ab2.sh BASE NEW - a short A/B of the wgmma prefill (issue 23) in one device call:
# builds bench_cuda of both trees (90a, in parallel), then 32 x 256 (narrow) and 8 x 1024 (wide),
# causal bf16 H 32/8 D 128 B 16, base and new alternated twice (per call median, back to back).
# Environment: OUT (logs), SHAPES (default "32 256 0 128;8 1024 0 128"), ROUNDS (default 2).
set -u -o pipefail
OUT=${OUT:-pf30_ab2}; mkdir -p "$OUT"
base=$(cd "$1" && pwd); new=$(cd "$2" && pwd)
CM=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a
    -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF -DKVA_WITH_CJSON=OFF)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
SECONDS=0
for t in "$base" "$new"; do
    (cmake -S "$t" -B "$t/b2" "${CM[@]}" && ninja -C "$t/b2" -j8 bench_cuda) > "$OUT/build_$(basename "$t").log" 2>&1 ||
        echo "BUILD FAILED $t" &
done
wait; echo "built in $SECONDS s"
IFS=';' read -ra shapes <<< "${SHAPES:-32 256 0 128;8 1024 0 128}"
for round in $(seq 1 "${ROUNDS:-2}"); do
    for s in "${shapes[@]}"; do
        read -r R Q C D <<< "$s"
        for t in base new; do
            d=$base; [ $t = new ] && d=$new
            line=$("$d/b2/bench_cuda" --mode prefill --batch "$R" --q-len "$Q" --context "$C" \
                --head-dim "$D" --iters 30 2>&1 >/dev/null | grep "^bench_cuda:" | head -1)
            echo "r$round $t ${R}x${Q}+${C} D$D $(echo "$line" | grep -oE 'median [0-9.]+ ms|check [a-zA-Z]+|back to back [0-9.]+ ms' | tr '\n' ' ')"
        done
    done
done | tee "$OUT/bench.txt"
echo "total $SECONDS s"
