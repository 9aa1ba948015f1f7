#!/usr/bin/env bash
# fuzz.sh - builds the libFuzzer harnesses of tests/fuzz (fuzz_c8_loader: the
# C8 checkpoint loader; fuzz_desc: cache and plan descriptors, writes, runs)
# with clang 14 and -fsanitize=fuzzer,address,undefined, writes their seed
# corpora (tests/fuzz/fuzz_seeds.c) and runs each harness.
#   scripts/fuzz.sh smoke    a few seconds of each (scripts/test.sh runs this;
#                            portable CPU kernels only, see below)
#   scripts/fuzz.sh build    the smoke's build and seeds only (scripts/test.sh
#                            runs it in the background before the smoke)
#   scripts/fuzz.sh [RUNS]   RUNS executions of each (default 1000000), one at
#                            a time (single-threaded; run it off CI's clock)
# The corpora grow in build-fuzz/corpus/NAME, logs go to build-fuzz/NAME.log,
# a crash or leak to build-fuzz/artifacts/ (every finding becomes a test).
#   KVA_FUZZ_CC       the compiler (default clang-14)
#   KVA_FUZZ_OPT      optimization of the instrumented build (default -O0: the
#                     shortest build, for the smoke; -O1 runs several times faster)
#   KVA_FUZZ_JOBS     J: long runs start J processes of RUNS/J executions each,
#                     on one shared corpus (what libFuzzer's -jobs does); default 1
#   KVA_FUZZ_TARGETS  harnesses to run (default "fuzz_c8_loader fuzz_desc")
#   KVA_FUZZ_TIMEOUT  seconds one input may take (default 10 for smoke, 60 otherwise:
#                     a valid plan of ~10^6 query tokens takes ~12 s in this -O0
#                     sanitizer build, ~0.8 s in Release; plan time is linear in
#                     the step's tokens, see tests/fuzz/findings/README.md)
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-1000000}
cc=${KVA_FUZZ_CC:-clang-14}
flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"
flags="$flags -fno-omit-frame-pointer -g ${KVA_FUZZ_OPT:--O0}"
# The smoke builds the CPU backend without its SIMD kernel files (portable
# kernels only, KVA_CPU_SIMD=OFF): they are 98% of this build's compile time
# (~340 of ~350 CPU s), the smoke only proves the harnesses build and run, and
# the sanitizer suite of scripts/test.sh covers the SIMD kernels. Long runs
# fuzz the SIMD kernels too.
simd=ON
[ "$mode" = smoke ] || [ "$mode" = build ] && simd=OFF
cmake -S . -B build-fuzz -G Ninja -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_C_FLAGS="$flags" -DKVA_FUZZ=ON -DKVA_CUDA=OFF -DKVA_BUILD_TESTS=OFF \
  -DKVA_CPU_SIMD=$simd >/dev/null
ninja -C build-fuzz -j"$(nproc)" fuzz_c8_loader fuzz_desc fuzz_seeds
mkdir -p build-fuzz/seeds/c8 build-fuzz/seeds/desc build-fuzz/artifacts \
  build-fuzz/corpus/fuzz_c8_loader build-fuzz/corpus/fuzz_desc
ASAN_OPTIONS=detect_leaks=0 build-fuzz/fuzz_seeds build-fuzz/seeds/c8 build-fuzz/seeds/desc
[ "$mode" = build ] && exit 0
# -O0 keeps the build short, but ASan at -O0 gives the SIMD kernels stack
# frames of megabytes: a large stack for the main thread and OpenMP's.
ulimit -s unlimited 2>/dev/null || ulimit -s 262144 2>/dev/null || true
export OMP_STACKSIZE=64M
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
status=0
for name in ${KVA_FUZZ_TARGETS:-fuzz_c8_loader fuzz_desc}; do
  seeds=build-fuzz/seeds/desc
  [ "$name" = fuzz_c8_loader ] && seeds=build-fuzz/seeds/c8
  if [ "$mode" = smoke ]; then
    limit=(-max_total_time=5 -timeout="${KVA_FUZZ_TIMEOUT:-10}")
  else
    limit=(-runs="$mode" -timeout="${KVA_FUZZ_TIMEOUT:-60}")
  fi
  jobs=1
  [ "$mode" != smoke ] && jobs=${KVA_FUZZ_JOBS:-1}
  [ "$jobs" -gt 1 ] && limit[0]=-runs=$(( (mode + jobs - 1) / jobs ))
  echo "== $name ${limit[*]} x $jobs"
  pids=()
  for j in $(seq 1 "$jobs"); do
    log=build-fuzz/$name.log
    [ "$jobs" -gt 1 ] && log=build-fuzz/$name.$j.log
    build-fuzz/$name "${limit[@]}" -rss_limit_mb=2048 -malloc_limit_mb=1024 -max_len=8192 \
      -print_final_stats=1 -artifact_prefix=build-fuzz/artifacts/ \
      build-fuzz/corpus/$name "$seeds" >"$log" 2>&1 &
    pids+=($!)
  done
  for j in $(seq 1 "$jobs"); do
    log=build-fuzz/$name.log
    [ "$jobs" -gt 1 ] && log=build-fuzz/$name.$j.log
    if ! wait "${pids[$((j - 1))]}"; then
      status=1
      tail -40 "$log"
    fi
    grep -E "^(#[0-9]+\s+(DONE|INITED)|stat::number_of_executed_units|stat::peak_rss)" \
      "$log" | tail -3 || true
    grep -Eo "cov: [0-9]+ ft: [0-9]+" "$log" | tail -1 || true
  done
done
exit $status
