#!/usr/bin/env bash
# cuda_tree.sh - on a machine with an NVIDIA GPU: build the CUDA backend
# (sm_90a) with only the targets of the tree-verification work, run
# test_cuda_tree and the CUDA tests whose kernels it touched (quick sets,
# each under a time limit), then time a 16-token draft tree against the
# 16-token chain (causal speculative decode) in one run (issue 18's target)
# and print a table. Logs under $OUT (default build-cuda/out).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build-cuda/out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF \
  -DKVA_WITH_CJSON=OFF -DKVA_WITH_MPI=OFF -DKVA_WITH_NCCL=OFF >"$out/cmake.log" 2>&1 ||
  { tail -20 "$out/cmake.log"; exit 1; }
t0=$(date +%s)
timeout 110 ninja -C build-cuda -j"$(nproc)" kvattn_cli test_cuda_tree test_cuda_attn \
  test_cuda_graph test_cuda_quant_attn test_cuda_prefill_mma >"$out/build.log" 2>&1 ||
  { tail -30 "$out/build.log"; exit 1; }
echo "build: $(($(date +%s) - t0)) s"
run() { # name seconds command...
  local n=$1 s=$2; shift 2
  local t=$(date +%s)
  KVA_TEST_QUICK=1 timeout "$s" "$@" >"$out/$n.log" 2>&1
  local rc=$?
  echo "$n: rc $rc, $(($(date +%s) - t)) s; $(grep -c 'CHECK failed\|FAIL' "$out/$n.log") failure lines"
  grep -m5 'CHECK failed\|FAIL\|mismatch' "$out/$n.log"
}
run test_cuda_tree 50 build-cuda/test_cuda_tree
b=build-cuda/kvattn
common="--backend cuda --mode decode --heads 32 --kv-heads 8 --head-dim 128 --block-size 16 --dtype bf16 --iters 100 --q-len 16 --context 4096"
for batch in 16 64; do
  for tree in none chain star random; do
    a=""; [ "$tree" != none ] && a="--tree $tree"
    timeout 20 $b bench $common --batch $batch $a >"$out/bench_${batch}_$tree.log" 2>&1
    echo "bench batch $batch tree $tree: rc $? $(grep -m1 'attention median' "$out/bench_${batch}_$tree.log") $(grep -m1 '^check' "$out/bench_${batch}_$tree.log")"
  done
done
run test_cuda_graph 15 build-cuda/test_cuda_graph
run test_cuda_prefill_mma 15 build-cuda/test_cuda_prefill_mma
run test_cuda_quant_attn 20 build-cuda/test_cuda_quant_attn
run test_cuda_attn 25 build-cuda/test_cuda_attn
