#!/usr/bin/env bash
# xeon.sh - cpu63's CPU-only call on the GPU machine's 16-core Xeon host (the
# GPU is not used): main (base) against branch cpu63 (new: the VNNI int8
# P.V of decode_avx512_pv_i8.inc) on the int8 decode, 16 threads, kernel
# decode_avx512bf16 (the registry's choice there) forced in both.
# Builds both trees (CPU only, kvattn only) in parallel, checks new against
# the reference (`kvattn bench` with its check, int8 and int8-token at GQA 4
# and 8), then dev/cpu63/ab.sh (base and new alternated, order flipped every
# round, 3 rounds) in two sections under deadlines so the whole stays inside
# BUDGET (140 s):
#  A. 4 x 16k: int8 GQA 4 and 8, f16 GQA 4 (unchanged code: its ratio is the
#     noise);
#  B. issue 23's batch, 16 x 16k: int8 and int8-token, GQA 1 and 4.
# Log: $OUT/xeon16_cpu63.txt (written as it goes); the two tables last.
# Staging (dev/cpu63/stage.sh), then
#   run(command="bash .dev/cpu63/new/dev/cpu63/xeon.sh", carry=[".dev/cpu63"], kind="nvidia-h200", timeout_s=150)
# On the VM (shell logic, 2 threads, one short round): NOBUILD=1 KB=... KN=...
#   THREADS=2 ROUNDS=1 BUDGET=60 OUT=/tmp/x bash dev/cpu63/xeon.sh
set -uo pipefail
S=$(cd "$(dirname "$0")/../../.." && pwd) # .dev/cpu63
O=${OUT:-/tmp/out}
mkdir -p "$O"
L=$O/xeon16_cpu63.txt
T0=$(date +%s)
END=$((T0 + ${BUDGET:-140}))
AB=$S/new/dev/cpu63/ab.sh
{
  echo "# $(date -u) host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc); flags:" \
    "$(grep -o -w -e avx512_vnni -e avx512_bf16 -e avx512vbmi -e amx_int8 /proc/cpuinfo | sort -u | tr '\n' ' ')"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/# GPU (unused): /'
  lscpu | grep -E 'Thread\(s\) per core|L2 cache|L3 cache' | sed 's/^/# /'
  echo "# base = main as staged: $(cat "$S/base/.commit" 2>/dev/null || echo unknown);" \
    "new = cpu63 as staged: $(cat "$S/new/.commit" 2>/dev/null || echo unknown)"
} > "$L"
build() { # tree
  (cd "$S/$1" && cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=OFF \
    -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_CJSON=OFF -DKVA_WITH_XXHASH=OFF -DKVA_WITH_MPI=OFF \
    -DKVA_WITH_NCCL=OFF -DKVA_BUILD_TESTS=OFF > "$O/cmake_$1.log" 2>&1 &&
    timeout 90 nice -n "${NICE:-0}" ninja -C build -j"${JOBS:-8}" kvattn > "$O/build_$1.log" 2>&1)
}
if [ -z "${NOBUILD:-}" ]; then
  build base &
  pb=$!
  build new &
  pn=$!
  wait $pb; rb=$?
  wait $pn; rn=$?
  echo "# build rc base $rb new $rn in $(($(date +%s) - T0)) s" >> "$L"
  KB=$S/base/build/kvattn
  KN=$S/new/build/kvattn
fi
export KB=${KB:-} KN=${KN:-} THREADS=${THREADS:-16} ROUNDS=${ROUNDS:-3}
[ -x "$KB" ] && [ -x "$KN" ] || { cat "$L"; tail -5 "$O"/build_*.log 2>/dev/null; exit 1; }
"$KN" info 2>&1 | grep -E '^cpu (isa|kernels)' | sed 's/^/# /' >> "$L"
# Correctness first: new's result against the reference (the bench's check).
ok=1
for c in "int8 4" "int8-token 4" "int8 8"; do
  set -- $c
  r=$(timeout 30 "$KN" bench --batch 2 --context 4096 --kv-heads 8 --heads $((8 * $2)) --dtype f16 \
    --kv-quant "$1" --threads "$THREADS" --iters 2 --no-ceiling --variant decode_avx512bf16 2>&1 |
    grep -m1 -E '^ *check ')
  echo "# check new $1 GQA$2 2 x 4k: ${r:-no check line}" >> "$L"
  case $r in *"(ok)"*) ;; *) ok=0 ;; esac
done
[ $ok = 1 ] || { echo "# check failed: no timing" >> "$L"; cat "$L"; exit 1; }
sec() { # name deadline, env for ab.sh...
  local n=$1 d=$2
  shift 2
  echo "== section $n $(date -u +%H:%M:%S) (+$(($(date +%s) - T0)) s)" >> "$L"
  env DEADLINE="$d" "$@" bash "$AB" > "$O/sec_$n.txt" 2>&1
  grep -v '^== medians\|^   \|^B  \|^b[0-9]' "$O/sec_$n.txt" | grep -v '^$' >> "$L"
}
sec A $((END - 75)) SHAPES="4:int8:4 4:int8:8 4:f16:4"
sec B "$END" SHAPES="16:int8:4 16:int8-token:4 16:int8:1 16:int8-token:1"
echo "# total $(($(date +%s) - T0)) s" >> "$L"
for n in A B; do
  echo "== table $n"
  sed -n '/^== medians/,$p' "$O/sec_$n.txt"
done >> "$L"
cat "$L"
