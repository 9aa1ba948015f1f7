#!/usr/bin/env bash
# dev/pf29/trace_ab.sh BASE NEW - issue 23 (pf29): the wgmma prefill's per-CTA-tile phase trace
# (dev/pf_trace) of two source trees in one device call. Builds each tree's kvattn_static (90a,
# in parallel) and pf_trace (this tree's dev/pf_trace/pf_trace.cu compiled against each tree's
# kernel header and library), runs the shapes alternated (base, new, base, new: library kernel
# median of 20 runs, traced kernel, phases), then the SDPA peers of the short shapes
# (bench/prefill_sdpa_peer.py short). Environment: OUT (logs), SHAPES ("R Q C NARROW;...").
set -u -o pipefail
OUT=${OUT:-pf29_out}; mkdir -p "$OUT"
here=$(cd "$(dirname "$0")/../.." && pwd)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
SECONDS=0
for t in "$@"; do
  ( cd "$t" &&
    cmake -S . -B build-trace -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90a -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF \
      -DKVA_WITH_CJSON=OFF &&
    ninja -C build-trace -j$(( $(nproc) / $# )) kvattn_static &&
    nvcc -O3 -std=c++17 -arch=sm_90a -DKVA_CUDA_SM90A=1 -DKVA_HAVE_CUDA=1 -diag-suppress 177 \
      -Iinclude -Isrc/core -Isrc/plan -Isrc/attn/cuda "$here/dev/pf_trace/pf_trace.cu" \
      build-trace/libkvattn.a -lgomp -lpthread -lm -o build-trace/pf_trace ) \
    > "$OUT/build-$(basename "$t").log" 2>&1 || { echo "BUILD FAILED $t"; tail -20 "$OUT/build-$(basename "$t").log"; } &
done
wait; echo "built in $SECONDS s"
IFS=';' read -ra S <<< "${SHAPES:-32 256 0 1;8 1024 0 0;32 256 0 0}"
for round in 1 2; do
  for s in "${S[@]}"; do
    read -r R Q C NW <<< "$s"
    for t in "$@"; do
      n=$(basename "$t")
      echo "== r$round $n $s"
      csv=(); [ "$round" = 1 ] && csv=("$OUT/csv_${n}_${R}x${Q}_n${NW}.csv")
      "$t/build-trace/pf_trace" "$R" "$Q" "$C" "$NW" ${csv[@]+"${csv[@]}"} 2>&1
    done
  done
done | tee "$OUT/trace.txt"
(cd "$OUT" && tar czf csv.tgz csv_*.csv && rm -f csv_*.csv)
PYTHONUNBUFFERED=1 timeout 150 python3 "$here/bench/prefill_sdpa_peer.py" short 2>&1 | tee "$OUT/sdpa.txt"
echo "total $SECONDS s"
