#!/usr/bin/env bash
# mla_cuda.sh - on a machine with an NVIDIA GPU: build the MLA targets, run
# test_cuda_mla (full, then compute-sanitizer memcheck on the quick set),
# check that the wgmma kernel is HGMMA in the SASS, then bench/peer_mla.py
# (kvattn's absorbed MLA decode next to FlashInfer's
# BatchMLAPagedAttentionWrapper and the copy ceiling, in one run).
#   OUT         logs and results (default build-mla/out)
#   KVA_WHEELS  folder of the FlashInfer wheels (installed offline into /tmp/kva_site)
#   KVA_STEPS   default "test memcheck sass peers"
#   KVA_STEP_TIMEOUT  seconds per test / sanitizer step (default 300)
#   KVA_CMAKE_EXTRA   extra cmake arguments (e.g. -DCMAKE_CUDA_FLAGS=-lineinfo)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-build-mla/out}
mkdir -p "$out"
steps=" ${KVA_STEPS:-test memcheck sass peers} "
# "ncu" (not in the default): Nsight Compute's speed-of-light, warp-state,
# compute and memory sections of one launch at H 128 (the compute-bound
# shape), of the default kernel and of each registry name in KVA_NCU_KERNELS.
# "racecheck" (not in the default): compute-sanitizer racecheck, quick set.
#   KVA_PEER_ARGS  extra arguments of bench/peer_mla.py (e.g. --forced NAMES)
has() { [[ "$steps" == *" $1 "* ]]; }
status=0
tmo=${KVA_STEP_TIMEOUT:-300}
ncu_default=1
t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
cmake -S . -B build-mla -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF \
  -DKVA_WITH_CJSON=OFF ${KVA_CMAKE_EXTRA:-} >"$out/cmake.log" 2>&1 || { tail -30 "$out/cmake.log"; exit 1; }
timeout 400 ninja -C build-mla -j"$(nproc)" test_cuda_mla bench_cuda_mla >"$out/build.log" 2>&1 ||
  { grep -E "error|Error" "$out/build.log" | head -30; tail -20 "$out/build.log"; exit 1; }
echo "== built"
if has test; then
  timeout "$tmo" build-mla/test_cuda_mla >"$out/test_cuda_mla.log" 2>&1 || status=1
  grep -E "case|FAILED|CHECK|passed" "$out/test_cuda_mla.log" | tail -40
  # A failing (or hanging) default kernel: keep only the SASS count and the
  # profiles of the forced kernels.
  [ $status = 0 ] || { steps=" sass ncu "; ncu_default=0; }
fi
if has memcheck; then
  KVA_TEST_QUICK=1 timeout "$tmo" compute-sanitizer --tool memcheck build-mla/test_cuda_mla \
    >"$out/memcheck_test_cuda_mla.log" 2>&1 || status=1
  echo "memcheck: $(grep -E 'ERROR SUMMARY' "$out/memcheck_test_cuda_mla.log" | tail -1); $(tail -1 "$out/memcheck_test_cuda_mla.log")"
fi
if has sass; then
  obj=$(find build-mla -name 'mla_decode_wgmma.cu.o' | head -1)
  echo "sass: $(cuobjdump -sass "$obj" | grep -c HGMMA) HGMMA, $(cuobjdump -sass "$obj" | grep -c 'LDL\|STL') LDL/STL in $obj"
fi
if has racecheck; then
  KVA_TEST_QUICK=1 timeout "$tmo" compute-sanitizer --tool racecheck build-mla/test_cuda_mla \
    >"$out/racecheck_test_cuda_mla.log" 2>&1 || status=1
  echo "racecheck: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/racecheck_test_cuda_mla.log" | tail -1); $(tail -1 "$out/racecheck_test_cuda_mla.log")"
fi
if has ncu; then
  # The default kernel, then each kernel of KVA_NCU_KERNELS (registry names) forced.
  ks=${KVA_NCU_KERNELS:-}
  [ $ncu_default = 0 ] || ks="default $ks"
  for k in $ks; do
    kargs=()
    [ "$k" = default ] || kargs=(--kernel "$k")
    timeout 120 ncu --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis \
      --section MemoryWorkloadAnalysis -k regex:mla_decode --launch-skip 2 --launch-count 1 \
      build-mla/bench_cuda_mla --batch 128 --context 4096 --heads 128 --iters 3 "${kargs[@]}" \
      >"$out/ncu_mla_h128_$k.txt" 2>&1
    # The warp stall reasons (cycles per issued instruction), a separate run.
    timeout 120 ncu --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
      -k regex:mla_decode --launch-skip 2 --launch-count 1 build-mla/bench_cuda_mla --batch 128 \
      --context 4096 --heads 128 --iters 3 "${kargs[@]}" >>"$out/ncu_mla_h128_$k.txt" 2>&1
    echo "== ncu $k"
    grep -E "Duration|Throughput|Issued Ipc|Warp Cycles Per Issued|L2 Hit|highest-utilized" \
      "$out/ncu_mla_h128_$k.txt" | head -12
    grep -E "issue_stalled" "$out/ncu_mla_h128_$k.txt" | sort -k3 -g -r | head -8
  done
fi
if has peers; then
  if [ -n "${KVA_WHEELS:-}" ] && ls "$KVA_WHEELS"/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/kva_site "$KVA_WHEELS"/*.whl >"$out/pip.log" 2>&1 && export PYTHONPATH=/tmp/kva_site
  fi
  export MAX_JOBS=$(nproc) FLASHINFER_NVCC_THREADS=4
  # What is left of a 10-minute device call, unless KVA_PEER_TIMEOUT says otherwise.
  left=$((570 - $(date +%s) + t0))
  PYTHONUNBUFFERED=1 timeout "${KVA_PEER_TIMEOUT:-$left}" python3 bench/peer_mla.py \
    --ours build-mla/bench_cuda_mla --out "$out" ${KVA_PEER_ARGS:-} 2>&1 | tee "$out/peer_mla.log" | tail -40
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
exit $status
