#!/usr/bin/env bash
# cuda.sh - on a machine with an NVIDIA GPU: build the CUDA backend, run the
# CUDA tests (ctest -L cuda), compute-sanitizer memcheck and racecheck on the
# quick test set, the benchmarks, the serving simulation on the GPU (kvattn
# serve-sim --backend cuda), then the peers (bench/peer_cuda.py:
# PyTorch SDPA flash/cuDNN, FlashInfer) and print a table. Where there is no
# GPU (or no nvcc) it says so and exits 0.
#   KVA_CUDA_ARCH   CMAKE_CUDA_ARCHITECTURES (default "90a"; "80;90a" for both)
#   KVA_WHEELS      folder of wheels to install for the peers (flashinfer-python,
#                   apache-tvm-ffi), installed offline into /tmp/kva_site
#   OUT             folder for logs and results (default build-cuda/out)
#   KVA_STEPS       steps to run (default "test sanitize bench prefill serve peers"; "bench" times
#                   the copy ceiling, then kvattn's decode kernels and shapes, the
#                   quantized caches (--quant) and `kvattn bench --dcp` at 128k, "prefill" its
#                   prefills through the public API, "peers" the table against peers, printed
#                   last; "quicktest" runs the quick test sets without ctest; "serve" runs the
#                   main job `kvattn serve-sim --backend cuda`: the default, --verify (also over
#                   int8 and fp8 caches), and 32 layers / 256 prompts; logs and JSON in $OUT)
#   KVA_PEER_ARGS   extra arguments of bench/peer_cuda.py (e.g. "--skip-prefill")
#   KVA_TARGETS     ninja targets to build (default: all; e.g. "kvattn_cli" for the serve step)
#   KVA_CMAKE_ARGS  extra cmake arguments (e.g. -DXXHASH_LIB=... where libxxhash-dev is missing)
#   KVA_SANITIZERS  compute-sanitizer tools of the "sanitize" step (default "memcheck racecheck")
#   KVA_SANITIZE_TESTS  tests they run in quick mode (default "test_cuda_attn test_cuda_cache test_cuda_quant test_cuda_quant_attn
#                   test_cuda_quant_prefill test_cuda_prefill_mma"; racecheck of the last takes ~5 min on an H100)
#   KVA_SANITIZE_TIMEOUT  seconds per sanitizer run (default 480)
#   KVA_DEBS        folder of .deb files of missing build dependencies (default ./.debs;
#                   scripts/device_deps.sh)
#   KVA_MACHINE     when set (e.g. "h100"), scripts/results.py writes docs/results/$KVA_MACHINE.md
#                   from this run's logs (and a copy to $OUT)
set -uo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "cuda.sh: no NVIDIA GPU on this machine; skipping the CUDA tests and benchmarks"
  exit 0
fi
if ! command -v nvcc >/dev/null 2>&1; then
  echo "cuda.sh: nvcc not found; skipping"
  exit 0
fi
out=${OUT:-build-cuda/out}
mkdir -p "$out"
jobs=$(nproc)
status=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"

. scripts/device_deps.sh
echo "== build (CUDA architectures ${KVA_CUDA_ARCH:-90a})"
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="${KVA_CUDA_ARCH:-90a}" ${KVA_DEP_ARGS[@]+"${KVA_DEP_ARGS[@]}"} ${KVA_CMAKE_ARGS:-} >"$out/cmake.log" 2>&1 || { cat "$out/cmake.log"; exit 1; }
ninja -C build-cuda -j"$jobs" ${KVA_TARGETS:-} >"$out/build.log" 2>&1 || { tail -50 "$out/build.log"; exit 1; }

steps=" ${KVA_STEPS:-test sanitize bench prefill serve peers} "
has() { [[ "$steps" == *" $1 "* ]]; }

if has test; then
echo "== ctest -L cuda"
ctest --test-dir build-cuda -L cuda --output-on-failure -j2 2>&1 | tee "$out/ctest_cuda.log" | tail -15
[ "${PIPESTATUS[0]}" = 0 ] || status=1
fi

if has quicktest; then
  for t in test_cuda_attn test_cuda_cache test_cuda_graph test_cuda_quant test_cuda_quant_attn test_cuda_quant_prefill; do
    KVA_TEST_QUICK=1 "build-cuda/$t" >"$out/quick_$t.log" 2>&1 || status=1
    echo "quick $t: $(tail -1 "$out/quick_$t.log")"
  done
fi

if has bench; then
  echo "== kvattn benchmarks (copy ceiling first, same run)"
  b=build-cuda/bench_cuda
  d="--mode decode --batch 64 --context 4095"
  {
  $b --mode copy --iters 20 2>&1 | head -1
  $b $d --graph-layers 32 2>&1 | head -1
  for k in decode_mma_sm80 decode_simt; do $b $d --kernel $k 2>&1 | head -1; done
  $b $d --kernel decode_mma_sm80 --graph-layers 32 2>&1 | tail -1
  $b $d --kernel decode_simt --graph-layers 32 2>&1 | tail -1
  for k in decode_mma_sm80 decode_simt; do
    $b $d --heads 64 --kv-heads 8 --kernel $k 2>&1 | head -1
    $b --mode decode --batch 64 --context 4092 --q-len 4 --kernel $k 2>&1 | head -1
    $b --mode decode --batch 4 --context 32767 --kernel $k 2>&1 | head -1
    $b $d --layout hnd --kernel $k 2>&1 | head -1
  done
  $b --mode decode --batch 64 --context 4088 --q-len 8 --heads 64 --kv-heads 8 2>&1 | head -1
  $b $d --dtype f16 --block-size 1 2>&1 | head -1
  $b $d --head-dim 64 2>&1 | head -1
  $b --mode decode --batch 32 --context 4095 --head-dim 256 --heads 16 --kv-heads 4 2>&1 | head -1
  $b --mode decode --batch 16 --context 4095 2>&1 | head -1
  } | tee "$out/bench_variants.log"
  echo "== quantized caches (decode 64 x 4k, bf16 q; KV bytes count 1-byte codes + token scales)"
  {
  $b --mode decode --batch 64 --context 4095 2>&1 | head -1
  for qf in int8 int8-token int8-token-v16 fp8; do
    $b --mode decode --batch 64 --context 4095 --quant $qf 2>&1 | head -1
  done
  $b --mode decode --batch 64 --context 4095 --heads 64 --kv-heads 8 --quant int8 2>&1 | head -1
  $b --mode decode --batch 4 --context 32767 --quant int8 2>&1 | head -1
  $b --mode decode --batch 64 --context 4092 --q-len 4 --quant int8 2>&1 | head -1
  $b --mode prefill --batch 4 --context 3072 --q-len 1024 --quant int8 --iters 5 2>&1 | head -1
  } | tee "$out/bench_quant.log"
  echo "== decode context parallelism emulated on this GPU (128k, R 1 and 8; results.py reads the blocks)"
  for nr in "4 1" "2 1" "4 8" "2 8"; do
    set -- $nr
    build-cuda/kvattn bench --dcp $1 --backend cuda --seq-len 131072 --batch $2 --iters 30 2>&1
  done | tee "$out/bench_dcp.log"
fi

if has prefill; then
  echo "== kvattn prefill benchmarks (kva_attention_run; prefills on prefill_mma)"
  b=build-cuda/bench_cuda
  {
  $b --mode prefill --batch 1 --context 0 --q-len 4096 --iters 20 2>&1 | head -1
  $b --mode prefill --batch 8 --context 0 --q-len 1024 --iters 20 2>&1 | head -1
  $b --mode prefill --batch 1 --context 0 --q-len 4096 --dtype f16 --iters 20 2>&1 | head -1
  $b --mode prefill --batch 1 --context 0 --q-len 4096 --head-dim 64 --iters 20 2>&1 | head -1
  $b --mode prefill --batch 4 --context 3072 --q-len 1024 --iters 20 2>&1 | head -1
  } | tee "$out/bench_prefill.log"
fi

if has serve; then
  echo "== kvattn serve-sim --backend cuda (default of scripts/main.sh, --verify, larger runs)"
  k=build-cuda/kvattn
  sv() { # name, args...: the full tables go to serve.log, the key lines to stdout
    local name=$1; shift
    local json=()
    case $name in default|l32_p256) json=(--json "$out/serve_$name.json");; esac
    echo "==== serve $name: $*" >>"$out/serve.log"
    $k serve-sim --backend cuda --no-progress ${json[@]+"${json[@]}"} "$@" >"$out/serve_cur.log" 2>&1
    local rc=$?
    cat "$out/serve_cur.log" >>"$out/serve.log"
    echo "serve $name ($*): exit $rc"
    grep -E "^serve-sim: backend|Benchmark duration|Output token throughput|Total Token|Median TTFT|Median TPOT|Median ITL|P99 ITL|GPU attention|Host plan|Engine steps|Preemptions|Reference check|kvattn" "$out/serve_cur.log"
    rm -f "$out/serve_cur.log"
    [ $rc = 0 ] || status=1
  }
  sv default
  sv verify --verify
  sv verify_int8 --verify --kv-quant int8
  sv verify_fp8 --verify --kv-quant fp8 --dtype f16
  sv verify_int8_token --verify --kv-quant int8-token --num-prompts 8 --output-len 16
  sv verify_int8_token_v16 --verify --kv-quant int8-token-v16 --num-prompts 8 --output-len 16
  sv verify_f16 --verify --dtype f16 --num-prompts 8 --output-len 16
  sv verify_f32 --verify --dtype f32 --num-prompts 8 --output-len 16
  sv l32 --layers 32 --kv-cache-mem 8G
  sv l32_p256 --layers 32 --num-prompts 256 --kv-cache-mem 16G
  sv l32_p256_b8k --layers 32 --num-prompts 256 --kv-cache-mem 16G --max-num-batched-tokens 8192
fi

if has sanitize; then
echo "== compute-sanitizer (quick sets)"
for tool in ${KVA_SANITIZERS:-memcheck racecheck}; do
  for t in ${KVA_SANITIZE_TESTS:-test_cuda_attn test_cuda_cache test_cuda_quant test_cuda_quant_attn test_cuda_quant_prefill test_cuda_prefill_mma}; do
    KVA_TEST_QUICK=1 timeout "${KVA_SANITIZE_TIMEOUT:-480}" compute-sanitizer --tool "$tool" --error-exitcode 9 \
      "build-cuda/$t" >"$out/sanitizer_${tool}_$t.log" 2>&1
    rc=$?
    echo "$tool $t: exit $rc; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitizer_${tool}_$t.log" | tail -1)"
    [ $rc = 0 ] || status=1
  done
done
fi

if has peers; then
echo "== benchmarks and peers"
if [ -n "${KVA_WHEELS:-}" ] && ls "$KVA_WHEELS"/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/kva_site "$KVA_WHEELS"/*.whl >"$out/pip.log" 2>&1 && export PYTHONPATH=/tmp/kva_site
fi
export MAX_JOBS=$jobs FLASHINFER_NVCC_THREADS=4
PYTHONUNBUFFERED=1 python3 bench/peer_cuda.py --ours build-cuda/bench_cuda --out "$out" ${KVA_PEER_ARGS:-} 2>"$out/peer_stderr.log"
[ $? = 0 ] || { status=1; tail -30 "$out/peer_stderr.log"; }
fi

# The machine's results page from this run's logs (docs/results/$KVA_MACHINE.md
# and a dated raw log in bench/results/; copied there too so $OUT brings them back).
if [ -n "${KVA_MACHINE:-}" ]; then
  python3 scripts/results.py cuda --logs "$out" --machine "$KVA_MACHINE" &&
    cp "docs/results/$KVA_MACHINE.md" "$out/" || status=1
fi
exit $status
