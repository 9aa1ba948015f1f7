#!/usr/bin/env bash
# cuda_ab.sh - before/after on one GPU machine, in one call: builds two source
# trees (BASE and NEW, e.g. a `git archive` of main and a branch) with the
# default CUDA architectures, then, per KVA_AB_STEPS:
#   build     configure + ninja both (times per target from .ninja_log, slowest first)
#   test      ctest -L cuda in NEW
#   sanitize  compute-sanitizer memcheck (test_cuda_attn, test_cuda_prefill_mma) and
#             racecheck (test_cuda_prefill_mma), KVA_TEST_QUICK=1, NEW build
#   bench     the reference shapes on both builds, alternated twice (base, new, base, new):
#             decode 64 x 4k bf16, quantized decodes, prefill 1 x 4096 at B 16 / 64,
#             8 x 1024, chunked 4 x 1024 after 3072, serve-sim --backend cuda default
# Usage: scripts/cuda_ab.sh BASE NEW   (OUT: log folder; KVA_AB_STEPS default "build test";
# KVA_AB_BUILDS: which trees the build step builds, default "base new";
# the builds go to $KVA_AB_BUILD/{base,new}, default /tmp/kva_ab, outside the trees, so a
# later call on the same machine finds them)
# Missing build dependencies (libssl-dev, libxxhash-dev, libcjson-dev) can travel as .deb files
# in $KVA_DEBS; they are unpacked under /tmp/dx.
set -uo pipefail
base=$(cd "$1" && pwd); new=$(cd "$2" && pwd)
out=${OUT:-ab_out}; mkdir -p "$out"
bd=${KVA_AB_BUILD:-/tmp/kva_ab}
steps=" ${KVA_AB_STEPS:-build test} "
has() { [[ "$steps" == *" $1 "* ]]; }
. "$(dirname "$0")/device_deps.sh"
extra=(${KVA_DEP_ARGS[@]+"${KVA_DEP_ARGS[@]}"})
status=0
if has build; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
  for t in ${KVA_AB_BUILDS:-base new}; do
    d=${!t}
    s=$(date +%s)
    cmake -S "$d" -B "$bd/$t" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON \
      "-DCMAKE_CUDA_ARCHITECTURES=90a;80" "${extra[@]}" >"$out/cmake_$t.log" 2>&1 || { tail -20 "$out/cmake_$t.log"; exit 1; }
    ninja -C "$bd/$t" -j16 >"$out/build_$t.log" 2>&1 || { tail -40 "$out/build_$t.log"; exit 1; }
    echo "build $t: $(( $(date +%s) - s )) s"
    # .ninja_log: start end mtime target hash (ms); the five slowest CUDA objects
    awk '!/^#/ && $4 ~ /\.cu\.o$/ {printf "%7.1f s  %s\n", ($2-$1)/1000, $4}' "$bd/$t/.ninja_log" |
      sort -rn | head -5 | sed "s/^/  $t /"
  done
fi
if has test; then
  ctest --test-dir "$bd/new" -L cuda --output-on-failure -j7 --timeout 540 >"$out/ctest_cuda.log" 2>&1
  rc=$?; [ $rc = 0 ] || status=1
  grep -E "tests passed|Test +#|Failed|\*\*\*" "$out/ctest_cuda.log" | tail -12
fi
if has sanitize; then
  for run in "memcheck test_cuda_attn" "memcheck test_cuda_prefill_mma" "racecheck test_cuda_prefill_mma"; do
    set -- $run
    KVA_TEST_QUICK=1 timeout 300 compute-sanitizer --tool "$1" --error-exitcode 9 "$bd/new/$2" \
      >"$out/san_$1_$2.log" 2>&1
    rc=$?; [ $rc = 0 ] || status=1
    echo "$1 $2: exit $rc; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/san_$1_$2.log" | tail -1)"
  done
fi
if has bench; then
  shapes=(
    "--mode decode --batch 64 --context 4095"
    "--mode decode --batch 64 --context 4095 --quant int8"
    "--mode decode --batch 64 --context 4095 --quant int8-token"
    "--mode decode --batch 64 --context 4095 --quant int8-token-v16"
    "--mode decode --batch 64 --context 4095 --quant fp8"
    "--mode prefill --batch 1 --context 0 --q-len 4096 --iters 20"
    "--mode prefill --batch 1 --context 0 --q-len 4096 --block-size 64 --iters 20"
    "--mode prefill --batch 8 --context 0 --q-len 1024 --iters 20"
    "--mode prefill --batch 4 --context 3072 --q-len 1024 --iters 20"
    "--mode prefill --batch 4 --context 3072 --q-len 1024 --quant int8 --iters 5"
    "--mode prefill --batch 1 --context 0 --q-len 4096 --head-dim 64 --iters 20"
  )
  for round in 1 2; do
    for t in base new; do
      for i in "${!shapes[@]}"; do
        line=$("$bd/$t/bench_cuda" ${shapes[$i]} 2>&1 >"$out/json_cur.txt" | grep "^bench_cuda:" | head -1)
        echo "$t r$round s$i $line" >>"$out/bench_raw.log"
        # the summary: median ms, TB/s, TFLOP/s, back to back, check
        echo "$t r$round s$i $(echo "$line" | grep -oE 'median [0-9.]+ ms, [0-9.]+ TB/s KV, [0-9.]+ TFLOP/s|check [a-zA-Z]+|back to back [0-9.]+ ms = [0-9.]+ TFLOP/s' | tr '\n' ' ')"
      done
      "$bd/$t/kvattn" serve-sim --backend cuda --no-progress >"$out/serve_cur.log" 2>&1
      rc=$?
      echo "$t r$round serve exit $rc $(grep -E 'Output token throughput|Median TPOT' "$out/serve_cur.log" | tr -s ' ' | tr '\n' ' ')" |
        tee -a "$out/bench_raw.log"
    done
  done
  rm -f "$out/json_cur.txt" "$out/serve_cur.log"
fi
exit $status
