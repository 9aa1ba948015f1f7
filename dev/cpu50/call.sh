#!/usr/bin/env bash
# call.sh - cpu50's one CPU-only call on the GPU machine's 16-core host (GPU unused):
# builds the CPU-only kvattn CLI of base (main) and new (branch cpu50) side by side,
# then issue 23's target rows (SET=target scripts/cpu_decode_paired.sh: f16 / int8 C8,
# GQA 1 / 4, 16 x 16k, 16 threads, --paired) for base and new alternated, ROUNDS rounds,
# and an in-cache probe (16 x 1k: 34 / 67 MB of K/V, inside L2 + L3) of the GQA 4 rows.
# Run from the staging folder's parent: bash .dev/cpu50/new/dev/cpu50/call.sh
set -uo pipefail
S=$(cd "$(dirname "$0")/../../.." && pwd)   # .dev/cpu50
O=${OUT:-/tmp/out}; mkdir -p "$O"; L=$O/xeon16_cpu50.txt
ROUNDS=${ROUNDS:-2}
{
echo "# $(date -u) host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc); flags:" \
  "$(grep -m1 -o -w -e avx512_vnni -e avx512_bf16 -e amx_int8 /proc/cpuinfo | sort -u | tr '\n' ' ')"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/# GPU (unused): /'
lscpu | grep -E 'Thread\(s\) per core|L2 cache|L3 cache|MHz' | sed 's/^/# /'
} > "$L"
t0=$(date +%s)
for t in base new; do
  ( cd "$S/$t" && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=OFF \
      -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_CJSON=OFF -DKVA_WITH_XXHASH=OFF -DKVA_WITH_MPI=OFF \
      -DKVA_WITH_NCCL=OFF -DKVA_BUILD_TESTS=OFF > "$O/cmake_$t.log" 2>&1 &&
    ninja -C build -j8 kvattn > "$O/build_$t.log" 2>&1; echo "build $t rc $?" >> "$L" ) &
done
wait
echo "# builds took $(( $(date +%s) - t0 )) s" >> "$L"
cd "$S/new"
export THREADS=16 BATCH=16 SET=target
for r in $(seq "$ROUNDS"); do
  for t in base new; do
    K=$S/$t/build/kvattn ROUNDS=1 bash scripts/cpu_decode_paired.sh 2>&1 | sed "s/^r1 /r$r $t /" >> "$L"
  done
done
echo "== in-cache probe: 16 x 1k, 16 threads, median / min ms (no --paired)" >> "$L"
for t in base new; do
  for q in none int8; do
    out=$("$S/$t/build/kvattn" bench --batch 16 --context 1024 --kv-heads 8 --heads 32 --dtype f16 \
      --kv-quant $q --threads 16 --iters 200 --no-check --no-ceiling 2>&1)
    echo "$t $q GQA4 16x1k $(echo "$out" | awk '/attention median/ {print $3, $4, "min", $8}')" >> "$L"
  done
done
echo "# total $(( $(date +%s) - t0 )) s" >> "$L"
cat "$L"
