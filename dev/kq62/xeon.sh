#!/usr/bin/env bash
# xeon.sh - kq62's CPU-only call on the GPU machine's 16-core Xeon host (the
# GPU is not used): the int8 decode of main (base) and of branch kq62 (new:
# the VNNI scores' query digits in AVX-512) at both AVX-512 levels, forced by
# --variant, 16 threads (dev/kq62/ab.sh: per shape base and new at each level
# back to back, order reversed every other round; decode_avx512 runs the same
# code in both builds, a control). cpu51's call found the AVX-512 level
# faster in cache (16 x 1k, GQA 4 / 8: 0.84 / 0.91x) and at 1 x 16k GQA 4
# (0.915x), slower at 4 x 16k GQA 8 (1.19x); this asks whether new's BF16
# level closes the in-cache gap. Builds base and new (CPU only, the CLI) in
# parallel, then 3 rounds in two sections under deadlines so that the whole
# stays inside BUDGET (140 s):
#  A. in cache: 16 x 1k, int8 and int8-token, GQA 4 and 8 (ITERS 100);
#  B. 1 x 16k GQA 4 / 8 and 4 x 16k GQA 4 / 8, int8 and int8-token.
# Log: $OUT/xeon16_kq62.txt (written as it goes), both tables of each section
# last (over the runs' attention medians, then over their minima).
# Staging (on the dev VM, after committing branch kq62):
#   rm -rf /work/main/.dev/kq62 && mkdir -p /work/main/.dev/kq62 &&
#   git -C /work/wt/kq62 archive --prefix=new/ kq62 | tar -x -C /work/main/.dev/kq62 &&
#   git -C /work/main archive --prefix=base/ main | tar -x -C /work/main/.dev/kq62 &&
#   git -C /work/main rev-parse --short main > /work/main/.dev/kq62/base/.commit &&
#   git -C /work/wt/kq62 rev-parse --short kq62 > /work/main/.dev/kq62/new/.commit
# then
#   run(command="bash .dev/kq62/new/dev/kq62/xeon.sh", carry=[".dev/kq62"], kind="nvidia-h200", timeout_s=150)
set -uo pipefail
S=$(cd "$(dirname "$0")/../../.." && pwd) # .dev/kq62
O=${OUT:-/tmp/out}
mkdir -p "$O"
L=$O/xeon16_kq62.txt
T0=$(date +%s)
END=$((T0 + ${BUDGET:-140}))
{
  echo "# $(date -u) host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc); flags:" \
    "$(grep -o -w -e avx512_vnni -e avx512_bf16 -e amx_int8 /proc/cpuinfo | sort -u | tr '\n' ' ')"
  echo "# base = main as staged: $(cat "$S/base/.commit" 2>/dev/null || echo unknown);" \
    "new = kq62 as staged: $(cat "$S/new/.commit" 2>/dev/null || echo unknown)"
} > "$L"
build() { # tree
  (cd "$S/$1" && timeout 90 cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=OFF \
    -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_CJSON=OFF -DKVA_WITH_XXHASH=OFF -DKVA_WITH_MPI=OFF \
    -DKVA_WITH_NCCL=OFF -DKVA_BUILD_TESTS=OFF > "$O/cmake_$1.log" 2>&1 &&
    timeout 90 ninja -C build -j8 kvattn > "$O/build_$1.log" 2>&1)
}
build base & pb=$!
build new & pn=$!
wait $pb; rb=$?
wait $pn; rn=$?
echo "# build rc base $rb new $rn in $(($(date +%s) - T0)) s" >> "$L"
export BASE=$S/base/build/kvattn NEW=$S/new/build/kvattn THREADS=16 ROUNDS=3
[ -x "$BASE" ] && [ -x "$NEW" ] || { tail -5 "$O"/build_*.log >> "$L"; cat "$L"; exit 1; }
"$NEW" info 2>&1 | grep -E '^cpu (isa|kernels)' | sed 's/^/# /' >> "$L"
AB=$S/new/dev/kq62/ab.sh
sec() { # name deadline, env for ab.sh...
  local n=$1 d=$2
  shift 2
  echo "== section $n $(date -u +%H:%M:%S) (+$(($(date +%s) - T0)) s)" >> "$L"
  env DEADLINE="$d" "$@" timeout $((d - $(date +%s) + 20)) bash "$AB" > "$O/sec_$n.txt" 2>&1
  grep '^== round\|^== end\|^== deadline' "$O/sec_$n.txt" >> "$L"
}
sec A $((END - 70)) SHAPES="16:1024:4 16:1024:8" ITERS_SHORT=100
sec B "$END" SHAPES="1:16384:4 1:16384:8 4:16384:4 4:16384:8"
echo "# total $(($(date +%s) - T0)) s" >> "$L"
for n in A B; do
  echo "== table $n"
  sed -n '/^== medians/,$p' "$O/sec_$n.txt"
done >> "$L"
cat "$L"
