#!/usr/bin/env bash
# xeon.sh - cpu51's CPU-only call on the GPU machine's 16-core Xeon host (the
# GPU is not used): which AVX-512 level should run the int8 decode there.
# decode_avx512 and decode_avx512bf16 share every chunk step; for int8 keys
# the BF16 level scores by VNNI (vpdpbusd), the AVX-512 level by fp32 FMAs
# (dev/cpu51/levels.sh says what differs). Builds main (.dev/cpu51/base, CPU
# only) once, then dev/cpu51/levels.sh at 16 threads, the two levels forced by
# --variant and alternated, 3 rounds, in three sections, each under a
# deadline so that the whole stays inside BUDGET (140 s):
#  A. the VM's rows: 1 x 16k and 4 x 16k; int8, int8-token, fp8, f16 (fp8 and
#     f16 run the same code on both levels: their ratio is the noise);
#     GQA 1, 4, 8;
#  B. issue 23's target batch: 16 x 16k, int8 and int8-token, GQA 1 and 4;
#  C. cpu50's in-cache shape: 16 x 1k (34 MB f16), int8 and f16, GQA 4 and 8.
# Log: $OUT/xeon16_cpu51.txt (written as it goes); the three tables last.
# Staging (dev/cpu51/stage.sh), then
#   run(command="bash .dev/cpu51/new/dev/cpu51/xeon.sh", carry=[".dev/cpu51"], kind="nvidia-h200", timeout_s=150)
set -uo pipefail
S=$(cd "$(dirname "$0")/../../.." && pwd) # .dev/cpu51
O=${OUT:-/tmp/out}
mkdir -p "$O"
L=$O/xeon16_cpu51.txt
T0=$(date +%s)
END=$((T0 + ${BUDGET:-140}))
LV=$S/new/dev/cpu51/levels.sh
{
  echo "# $(date -u) host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc); flags:" \
    "$(grep -o -w -e avx512_vnni -e avx512_bf16 -e amx_int8 /proc/cpuinfo | sort -u | tr '\n' ' ')"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/# GPU (unused): /'
  lscpu | grep -E 'Thread\(s\) per core|L2 cache|L3 cache' | sed 's/^/# /'
  echo "# base = main as staged: $(cat "$S/base/.commit" 2>/dev/null || echo unknown)"
} > "$L"
(cd "$S/base" && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=OFF \
  -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_CJSON=OFF -DKVA_WITH_XXHASH=OFF -DKVA_WITH_MPI=OFF \
  -DKVA_WITH_NCCL=OFF -DKVA_BUILD_TESTS=OFF > "$O/cmake_base.log" 2>&1 &&
  nice -n "${NICE:-0}" ninja -C build -j"${JOBS:-16}" kvattn > "$O/build_base.log" 2>&1)
echo "# build rc $? in $(($(date +%s) - T0)) s" >> "$L"
export K=$S/base/build/kvattn THREADS=16 ROUNDS=3
[ -x "$K" ] || { cat "$L"; exit 1; }
"$K" info 2>&1 | grep -E '^cpu (isa|kernels)' | sed 's/^/# /' >> "$L"
sec() { # name deadline, env for levels.sh...
  local n=$1 d=$2
  shift 2
  echo "== section $n $(date -u +%H:%M:%S) (+$(($(date +%s) - T0)) s)" >> "$L"
  env DEADLINE="$d" "$@" bash "$LV" > "$O/sec_$n.txt" 2>&1
  grep -v '^== medians\|^   \|^B  \|^b[0-9]' "$O/sec_$n.txt" | grep -v '^$' >> "$L"
}
sec A $((END - 50)) BATCHES="1 4" FORMATS="int8 int8-token fp8 f16" GQAS="1 4 8"
sec B $((END - 12)) BATCHES=16 FORMATS="int8 int8-token" GQAS="1 4"
sec C "$END" BATCHES=16 CONTEXT=1024 ITERS=100 FORMATS="int8 f16" GQAS="4 8"
echo "# total $(($(date +%s) - T0)) s" >> "$L"
for n in A B C; do
  echo "== table $n"
  sed -n '/^== medians/,$p' "$O/sec_$n.txt"
done >> "$L"
cat "$L"
