#!/usr/bin/env bash
# py_gpu.sh - the Python package on a GPU machine: builds libkvattn.so with the
# CUDA backend (library only; no OpenSSL/xxHash/cJSON needed), times the
# Python layer's per-call cost on the machine's CPU cores
# (bench/py_overhead.py: CPU backend, 1 thread), then runs kvattn.flashinfer
# next to FlashInfer on the GPU (bench/flashinfer_side_by_side.py).
#   KVA_WHEELS     folder of wheels for the peer (flashinfer-python, apache-tvm-ffi),
#                  installed offline into /tmp/kva_site
#   KVA_SIDE_ARGS  arguments of the side-by-side script (default "--quick")
#   KVA_SIDE_TIMEOUT  seconds for it (default 600; FlashInfer JIT-compiles each new shape)
#   OUT            folder for logs (default build-py-cuda/out)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build-py-cuda/out}
mkdir -p "$out"
jobs=$(nproc)
t0=$(date +%s)
cmake -S . -B build-py-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DKVA_BUILD_TESTS=OFF -DKVA_BUILD_TOOLS=OFF -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF \
  -DKVA_WITH_CJSON=OFF >"$out/cmake.log" 2>&1 &&
  ninja -C build-py-cuda -j"$jobs" libkvattn.so >"$out/build.log" 2>&1 ||
  { tail -20 "$out/cmake.log" "$out/build.log"; exit 1; }
echo "build: $(($(date +%s) - t0)) s"
lib=$PWD/build-py-cuda/libkvattn.so
echo "== Python per-call cost ($(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2))"
for shape in "1 16" "8 64"; do
  set -- $shape
  KVATTN_LIBRARY=$lib PYTHONPATH=python python3 bench/py_overhead.py --requests "$1" \
    --seq-len "$2" --iters 2000 | tee -a "$out/py_overhead.txt"
done
echo "== kvattn.flashinfer next to FlashInfer"
if [ -n "${KVA_WHEELS:-}" ] && ls "$KVA_WHEELS"/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/kva_site \
    "$KVA_WHEELS"/*.whl >"$out/pip.log" 2>&1
fi
PYTHONPATH=/tmp/kva_site:python KVATTN_LIBRARY=$lib MAX_JOBS=$jobs FLASHINFER_NVCC_THREADS=4 \
  timeout "${KVA_SIDE_TIMEOUT:-600}" python3 bench/flashinfer_side_by_side.py --out "$out" \
  ${KVA_SIDE_ARGS:---quick} 2>"$out/side_stderr.log" | tee "$out/side_by_side.txt"
rc=${PIPESTATUS[0]}
[ "$rc" = 0 ] || tail -15 "$out/side_stderr.log"
exit "$rc"
