#!/usr/bin/env bash
# cascade_gpu.sh - cascade (shared-prefix) plans on a GPU machine in one call:
# builds the CUDA backend (sm_90a) and the targets below while FlashInfer
# JIT-compiles its kernels for the same shapes (bench/peer_cascade.py --warm,
# in the background), runs test_cuda_cascade, times `kvattn bench --cascade
# --backend cuda` on the issue's shapes, then FlashInfer's plain decode and
# MultiLevelCascadeAttentionWrapper on the same shapes, and prints a table.
#   KVA_WHEELS  folder of wheels for the peer (flashinfer-python, apache-tvm-ffi)
#   OUT         folder for logs (default build-cuda/out)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build-cuda/out}
mkdir -p "$out"
t0=$(date +%s)
shapes="128:32768:256 64:8192:256 8:128:256"
if [ -n "${KVA_WHEELS:-}" ] && ls "$KVA_WHEELS"/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kva_site \
    "$KVA_WHEELS"/*.whl >"$out/pip.log" 2>&1
fi
export PYTHONPATH=/tmp/kva_site MAX_JOBS=8 FLASHINFER_NVCC_THREADS=2
timeout 400 python3 bench/peer_cascade.py --warm >"$out/peer_warm.log" 2>&1 &
warm=$!
. scripts/device_deps.sh
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a ${KVA_DEP_ARGS[@]+"${KVA_DEP_ARGS[@]}"} >"$out/cmake.log" 2>&1 &&
  timeout 330 ninja -C build-cuda -j16 kvattn_cli test_cuda_cascade >"$out/build.log" 2>&1 ||
  { tail -40 "$out/cmake.log" "$out/build.log"; exit 1; }
echo "build: $(($(date +%s) - t0)) s"
timeout 150 build-cuda/test_cuda_cascade >"$out/test_cuda_cascade.log" 2>&1
echo "test_cuda_cascade (rc $?): $(tail -1 "$out/test_cuda_cascade.log")"
grep -m5 "failed\|mismatch" "$out/test_cuda_cascade.log"
wait $warm
echo "peer warm-up (rc $?): $(($(date +%s) - t0)) s"
for s in $shapes; do
  IFS=: read -r R P S <<<"$s"
  timeout 60 build-cuda/kvattn bench --cascade --backend cuda --batch "$R" --shared-prefix "$P" \
    --suffix "$S" --iters 30 --warmup 5 >>"$out/bench_cascade.txt" 2>&1
done
timeout 120 python3 bench/peer_cascade.py >"$out/peer.txt" 2>"$out/peer_stderr.log"
echo "total: $(($(date +%s) - t0)) s"
nvidia-smi --query-gpu=name --format=csv,noheader
cat "$out/bench_cascade.txt" "$out/peer.txt"
