#!/usr/bin/env bash
# xeon_probe.sh - the next CPU-only call for issue 23's int8 GQA 4 row on the GPU machine's 16-core
# Xeon host (not run yet: cpu50's one call was dev/cpu50/call.sh). What it settles:
#  1. the VNNI port question (dev/cpuq28/vnni_ports.c: one core, 512-bit vpdpbusd alone and mixed
#     with FMAs / shuffles);
#  2. whether moving the int8 -> fp32 conversion off port 0 pays there: a third binary "magic" =
#     new + dev/cpu50/magic_cvt.patch (ld16: vpaddd + vsubps of 1.5 * 2^23 instead of vcvtdq2ps;
#     exact, same results bitwise; on the Zen 5 dev VM it is even at GQA 4 and 5% slower at GQA 1);
#  3. VNNI vs fp32 key scores (--variant decode_avx512) in cache and at 16k, per binary;
#  4. the target rows (SET=target scripts/cpu_decode_paired.sh), binaries alternated, ROUNDS rounds.
# Staging as in common.md: .dev/cpu50/{base,new} (git archive of main and of branch cpu50), then
#   run(command="bash .dev/cpu50/new/dev/cpu50/xeon_probe.sh", carry=[".dev/cpu50"], timeout_s=150)
# Expected wall: builds ~35 s (three in parallel), probe ~5 s, 16x1k rows ~10 s, target rows ~25 s
# per round for three binaries.
set -uo pipefail
S=$(cd "$(dirname "$0")/../../.." && pwd)
O=${OUT:-/tmp/out}; mkdir -p "$O"; L=$O/xeon16_probe.txt
ROUNDS=${ROUNDS:-2}
echo "# $(date -u) host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)" > "$L"
rm -rf "$S/magic" && cp -r "$S/new" "$S/magic" && rm -rf "$S/magic/build" && (cd "$S/magic" && { patch -p1 < dev/cpu50/magic_cvt.patch || git apply dev/cpu50/magic_cvt.patch; } >> "$L" 2>&1)
t0=$(date +%s)
for t in base new magic; do
  ( cd "$S/$t" && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=OFF \
      -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_CJSON=OFF -DKVA_WITH_XXHASH=OFF -DKVA_WITH_MPI=OFF \
      -DKVA_WITH_NCCL=OFF -DKVA_BUILD_TESTS=OFF > "$O/cmake_$t.log" 2>&1 &&
    ninja -C build -j5 kvattn > "$O/build_$t.log" 2>&1; echo "build $t rc $?" >> "$L" ) &
done
wait
echo "# builds $(( $(date +%s) - t0 )) s" >> "$L"
gcc -O2 -mavx512f -mavx512vnni -o /tmp/vnni_ports "$S/new/dev/cpuq28/vnni_ports.c" &&
  taskset -c 0 /tmp/vnni_ports >> "$L" 2>&1
echo "== 16 x 1k in cache, 16 threads, GQA 4, median / min" >> "$L"
for t in base new magic; do
  for a in "none decode_avx512bf16" "int8 decode_avx512bf16" "int8 decode_avx512"; do set -- $a
    out=$("$S/$t/build/kvattn" bench --batch 16 --context 1024 --kv-heads 8 --heads 32 --dtype f16 \
      --kv-quant $1 --threads 16 --iters 200 --no-check --no-ceiling --variant $2 2>&1)
    echo "$t $1 $2 $(echo "$out" | awk '/attention median/ {print $3, $4, "min", $8}')" >> "$L"
  done
done
cd "$S/new"
export THREADS=16 BATCH=16 SET=target
for r in $(seq "$ROUNDS"); do
  for t in base new magic; do
    K=$S/$t/build/kvattn ROUNDS=1 bash scripts/cpu_decode_paired.sh 2>&1 | grep -v '^start\|^end' |
      sed "s/^r1 /r$r $t /" >> "$L"
    out=$("$S/$t/build/kvattn" bench --batch 16 --context 16384 --kv-heads 8 --heads 32 --dtype f16 \
      --kv-quant int8 --threads 16 --iters 16 --no-check --paired --no-ceiling --variant decode_avx512 2>&1)
    echo "r$r $t int8 GQA4 t16 fp32-scores $(echo "$out" | awk '/attention median/ {print $3, $4}');" \
      "paired $(echo "$out" | awk '/paired read/ {print $3, "of read passes", $(NF-1), "GB/s"}')" >> "$L"
  done
done
echo "# total $(( $(date +%s) - t0 )) s" >> "$L"
cat "$L"
