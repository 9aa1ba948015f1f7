#!/usr/bin/env bash
# cascade_gpu.sh - issue 18's GPU targets in one call on one GPU machine:
#   * cascade (shared-prefix) decode: `kvattn bench --cascade --backend cuda`
#     on the issue's shapes, then FlashInfer 0.7.2's tensor-core paged decode
#     and MultiLevelCascadeAttentionWrapper on the same shapes
#     (bench/peer_cascade.py), in the same run;
#   * chunked local attention: a decode at 128k context with attention_chunk
#     8192 between two 8k-context decodes;
#   * tree verification: a 16-token draft tree (random, star) over 4k context
#     against the 16-token chain, and causal speculative decoding (no tree).
# FlashInfer JIT-compiles its kernels on first use (minutes): its two modules
# (the plain decode's FA2 prefill kernels, the cascade's FA3 ones on sm_90a)
# compile in two background processes from the start, while kvattn builds (or
# is taken from KVA_PREBUILT) and test_cuda_cascade runs; kvattn's timed runs
# start when the cascade's module is built, FlashInfer's when both are.
#   KVA_WHEELS    folder of wheels for the peer (flashinfer-python, apache-tvm-ffi)
#   KVA_PREBUILT  folder holding `kvattn` and `test_cuda_cascade` built for
#                 sm_90a elsewhere (no build here); unset: build in build-cuda
#   KVA_PEER_WARM_S  time limit of each FlashInfer warm-up process [330]
#   KVA_CMAKE_ARGS   more cmake arguments (-DKVA_WITH_OPENSSL=OFF ... on a machine
#                 without the dependencies and no .debs)
#   OUT           folder for logs (default build-cuda/out)
# scripts/results.py cascade --logs OUT --machine NAME writes the results page.
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
export PYTHONPATH=/tmp/kva_site${PYTHONPATH:+:$PYTHONPATH} FLASHINFER_NVCC_THREADS=1
warm=${KVA_PEER_WARM_S:-330}
MAX_JOBS=12 timeout "$warm" python3 bench/peer_cascade.py --warm --only cascade \
  >"$out/peer_warm_cascade.log" 2>&1 &
wc=$!
MAX_JOBS=8 timeout "$warm" nice -n 5 python3 bench/peer_cascade.py --warm --only plain \
  >"$out/peer_warm_plain.log" 2>&1 &
wp=$!
bin=${KVA_PREBUILT:-}
if [ -z "$bin" ]; then
  bin=build-cuda
  . scripts/device_deps.sh
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a ${KVA_DEP_ARGS[@]+"${KVA_DEP_ARGS[@]}"} ${KVA_CMAKE_ARGS:-} \
    >"$out/cmake.log" 2>&1 &&
    timeout 330 nice -n 10 ninja -C build-cuda -j16 kvattn_cli test_cuda_cascade >"$out/build.log" 2>&1 ||
    { tail -40 "$out/cmake.log" "$out/build.log"; exit 1; }
fi
echo "kvattn ready: $(($(date +%s) - t0)) s"
timeout 150 "$bin/test_cuda_cascade" >"$out/test_cuda_cascade.log" 2>&1
echo "test_cuda_cascade (rc $?): $(tail -1 "$out/test_cuda_cascade.log")"
grep -m5 "failed\|mismatch" "$out/test_cuda_cascade.log"
# kvattn's timings (GPU-bound, CUDA events) once the cascade module is built;
# FlashInfer's (Python launches each run) only when no compiler runs.
wait $wc
rc_c=$?
echo "peer warm-up, cascade (rc $rc_c): $(($(date +%s) - t0)) s"
for s in $shapes; do
  IFS=: read -r R P S <<<"$s"
  timeout 60 "$bin/kvattn" bench --cascade --backend cuda --batch "$R" --shared-prefix "$P" \
    --suffix "$S" --iters 30 --warmup 5 >>"$out/bench_cascade.txt" 2>&1
done
common="--backend cuda --mode decode --heads 32 --kv-heads 8 --head-dim 128 --block-size 16"
common="$common --dtype bf16 --iters 100"
for c in "8191" "131071 --attention-chunk 8192" "8191"; do
  echo "== chunk: context $c" >>"$out/bench_chunk.txt"
  timeout 60 "$bin/kvattn" bench $common --batch 16 --context $c >>"$out/bench_chunk.txt" 2>&1
done
for t in none chain star random chain; do
  echo "== tree: $t" >>"$out/bench_tree.txt"
  timeout 60 "$bin/kvattn" bench $common --batch 16 --q-len 16 --context 4096 \
    $([ $t = none ] || echo --tree $t) >>"$out/bench_tree.txt" 2>&1
done
wait $wp
rc_p=$?
echo "peer warm-up, plain (rc $rc_p): $(($(date +%s) - t0)) s"
only=()
[ $rc_p -ne 0 ] && only=(--only cascade)
[ $rc_c -ne 0 ] && only=(--only plain)
if [ $rc_c -eq 0 ] || [ $rc_p -eq 0 ]; then
  timeout 120 python3 bench/peer_cascade.py "${only[@]}" >"$out/peer.txt" 2>"$out/peer_stderr.log"
fi
echo "total: $(($(date +%s) - t0)) s"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
grep -h "cascade bench\|plain  \|cascade  \|speedup" "$out/bench_cascade.txt"
cat "$out/peer.txt" 2>/dev/null
grep -h "^==\|attention median" "$out/bench_chunk.txt" "$out/bench_tree.txt"
