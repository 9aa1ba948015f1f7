#!/usr/bin/env bash
# dcp_nccl.sh - on a machine with N >= 2 NVIDIA GPUs (the device tool's
# nvidia-h100-x2): build the NCCL combine's tests and bench, run
# test_dcp_nccl (one rank), test_dcp_nccl_ranks N (N processes, one per GPU),
# test_cuda_dcp, then dcp_nccl_bench N (128k context). NCCL comes from the
# nvidia-nccl wheel under the machine's PyTorch (CMake's finder) or NCCL_ROOT.
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
#   KVA_DCP_N         ranks (default 2)
#   KVA_DCP_BENCH     dcp_nccl_bench arguments after N (default "8 131072 32 8 128 1 50")
#   KVA_CUDA_ARCH     CMAKE_CUDA_ARCHITECTURES (default 90a)
#   OUT               folder for logs (default build-dcp/out)
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
out=${OUT:-build-dcp/out}
mkdir -p "$out"
N=${KVA_DCP_N:-2}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
nvidia-smi topo -m >"$out/topo.txt" 2>&1 || true
cmake -S . -B build-dcp -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="${KVA_CUDA_ARCH:-90a}" -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF \
  -DKVA_WITH_CJSON=OFF -DKVA_WITH_MPI=OFF >"$out/cmake.log" 2>&1 || { tail -30 "$out/cmake.log"; exit 1; }
grep "NCCL combine" "$out/cmake.log"
s=$(date +%s)
timeout 400 ninja -C build-dcp -j"$(nproc)" test_dcp_nccl test_dcp_nccl_ranks dcp_nccl_bench test_cuda_dcp \
  >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
echo "build: $(($(date +%s) - s)) s"
status=0
for t in "test_dcp_nccl" "test_dcp_nccl_ranks $N" "test_cuda_dcp"; do
  timeout 300 build-dcp/$t >"$out/${t%% *}.log" 2>&1 || status=1
  echo "$t: $(tail -1 "$out/${t%% *}.log")"
done
[ $status = 0 ] || tail -30 "$out/test_dcp_nccl_ranks.log"
timeout 300 build-dcp/dcp_nccl_bench "$N" ${KVA_DCP_BENCH:-8 131072 32 8 128 1 50} 2>&1 | tee "$out/bench.log"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
exit $status
