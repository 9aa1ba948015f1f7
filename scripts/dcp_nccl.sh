#!/usr/bin/env bash
# dcp_nccl.sh - on a machine with N >= 2 NVIDIA GPUs (the device tool's
# nvidia-h100-x2 / -x4): build the NCCL combine's tests and bench, run
# test_dcp_nccl (one rank), test_cuda_dcp (unless KVA_DCP_CUDA_TEST=0), and for every N of KVA_DCP_NS
# test_dcp_nccl_ranks N (N processes, one per GPU) and dcp_nccl_bench N for
# every request count of KVA_DCP_RS (128k context). NCCL comes from the
# nvidia-nccl wheel under the machine's PyTorch (CMake's finder) or NCCL_ROOT.
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
#   KVA_DCP_NS        rank counts (default "2"; "2 4" on a 4-GPU machine)
#   KVA_DCP_RS        request counts of the bench (default "8 1")
#   KVA_DCP_BENCH     dcp_nccl_bench arguments after N and R (default "131072 32 8 128 1 50")
#   KVA_DCP_SPLITS    when 1, also bench_cuda's one-request decode at the
#                     unsharded and per-rank context lengths with the plan's
#                     split choice and forced split counts (the per-rank
#                     ratio of a single long request)
#   KVA_DCP_SYSLIB    another libnccl.so.2 (default: the image's
#                     /lib/x86_64-linux-gnu/libnccl.so.2 where it exists and
#                     is not the wheel's): test_dcp_nccl_ranks 2 runs once more
#                     with it preloaded, where the LSA setup must refuse the
#                     version mismatch (test_dcp_nccl_ranks_2_syslib); "" skips
#   KVA_MACHINE       when set (e.g. "h100x4-dcp"), scripts/results.py dcp
#                     writes docs/results/$KVA_MACHINE.md from the logs
#   KVA_CUDA_ARCH     CMAKE_CUDA_ARCHITECTURES (default 90a)
#   KVA_DCP_TIMEOUT   seconds each test or bench run may take (default 300)
#   OUT               folder for logs (default build-dcp/out)
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0
out=${OUT:-build-dcp/out}
mkdir -p "$out"
NS=${KVA_DCP_NS:-2}
RS=${KVA_DCP_RS:-8 1}
# The wheel's libnccl first: the image's /lib/x86_64-linux-gnu/libnccl.so.2
# (2.28.3) is otherwise what the loader finds, and the LSA combine needs the
# library of the headers it was compiled with (2.28.9).
ncdir=$(python3 -c "import nvidia.nccl as n; print(list(n.__path__)[0])" 2>/dev/null)
[ -n "${NCCL_ROOT:-}" ] && ncdir=$NCCL_ROOT
[ -n "$ncdir" ] && export LD_LIBRARY_PATH="$ncdir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
nvidia-smi topo -m >"$out/topo.txt" 2>&1 || true
cmake -S . -B build-dcp -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="${KVA_CUDA_ARCH:-90a}" -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF \
  -DKVA_WITH_CJSON=OFF -DKVA_WITH_MPI=OFF >"$out/cmake.log" 2>&1 || { tail -30 "$out/cmake.log"; exit 1; }
grep "NCCL combine" "$out/cmake.log"
targets="test_dcp_nccl test_dcp_nccl_ranks dcp_nccl_bench"
[ "${KVA_DCP_CUDA_TEST:-1}" = 1 ] && targets="$targets test_cuda_dcp"
[ "${KVA_DCP_SPLITS:-0}" = 1 ] && targets="$targets bench_cuda"
s=$(date +%s)
timeout 400 ninja -C build-dcp -j"$(nproc)" $targets >"$out/build.log" 2>&1 ||
  { tail -40 "$out/build.log"; exit 1; }
echo "build: $(($(date +%s) - s)) s"
# Which libnccl the binaries load (the tests and the bench print its version).
ldd build-dcp/test_dcp_nccl_ranks | grep -i nccl | tee "$out/ldd.txt"
status=0
run_test() { # name, command...
  local name=$1
  shift
  timeout "${KVA_DCP_TIMEOUT:-300}" "$@" >"$out/$name.log" 2>&1 || { status=1; tail -30 "$out/$name.log"; }
  echo "$name: $(tail -1 "$out/$name.log")"
}
run_test test_dcp_nccl build-dcp/test_dcp_nccl
[ "${KVA_DCP_CUDA_TEST:-1}" = 1 ] && run_test test_cuda_dcp build-dcp/test_cuda_dcp
for n in $NS; do run_test "test_dcp_nccl_ranks_$n" build-dcp/test_dcp_nccl_ranks "$n"; done
syslib=${KVA_DCP_SYSLIB-/lib/x86_64-linux-gnu/libnccl.so.2}
if [ -n "$syslib" ] && [ -e "$syslib" ] && ! grep -q -e "$syslib" -e "$(readlink -f "$syslib")" "$out/ldd.txt"; then
  run_test test_dcp_nccl_ranks_2_syslib env LD_PRELOAD="$syslib" build-dcp/test_dcp_nccl_ranks 2
  grep "^NCCL" "$out/test_dcp_nccl_ranks_2_syslib.log"
fi
for n in $NS; do
  for r in $RS; do
    log="$out/bench_N${n}_R${r}.log"
    timeout "${KVA_DCP_TIMEOUT:-300}" build-dcp/dcp_nccl_bench "$n" "$r" ${KVA_DCP_BENCH:-131072 32 8 128 1 50} >"$log" 2>&1 ||
      { status=1; tail -20 "$log"; }
  done
done
if [ "${KVA_DCP_SPLITS:-0}" = 1 ]; then
  # One 128k request split over 1, 2 and 4 ranks: the plan's split choice
  # (0) and forced chunk counts per unit, stream and graph timings.
  for ctx in 131072 65536 32768; do
    for sp in 0 16 64; do
      timeout 60 build-dcp/bench_cuda --mode decode --batch 1 --context "$ctx" --heads 32 \
        --kv-heads 8 --head-dim 128 --dtype bf16 --iters 50 --graph-layers 10 --splits "$sp" \
        2>>"$out/splits.log" | sed "s/^{/{\"forced_splits\": $sp, /" >>"$out/splits.json"
      [ "${PIPESTATUS[0]}" = 0 ] || status=1
    done
  done
fi
if [ -n "${KVA_MACHINE:-}" ]; then
  python3 scripts/results.py dcp --logs "$out" --machine "$KVA_MACHINE" &&
    cp "docs/results/$KVA_MACHINE.md" "$out/" || status=1
fi
exit $status
