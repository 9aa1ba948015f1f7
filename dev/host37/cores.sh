#!/usr/bin/env bash
# cores.sh - issue 23 (host37): is serve-sim's plan share set by the host core
# the process runs on? On the H100 host one binary's in-situ decode plan moved
# 5.7 -> 11.2 us between two runs back to back (bench/results/
# h100_2026-11-28_host37.txt). Builds one tree (kvattn, bench_plan; sm_90a),
# prints the CPU / NUMA / GPU topology, then runs serve-sim --backend cuda
# (default workload, --plan-probe 1) pinned to each core in turn (taskset -c),
# REPS (default 2) rounds over the cores, and once unpinned per round.
# Usage: KVA_DEBS=$PWD/debs OUT=... bash new/dev/host37/cores.sh new
set -uo pipefail
new=$(cd "$1" && pwd)
out=${OUT:-$PWD/out}; mkdir -p "$out"; LOG=$out/cores.txt; L=/tmp/h37cores; mkdir -p $L
. "$new/scripts/device_deps.sh"; extra=(${KVA_DEP_ARGS[@]+"${KVA_DEP_ARGS[@]}"})
say() { echo "$*" | tee -a "$LOG"; }
say "# gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
lscpu | grep -E 'Model name|Thread|Core|Socket|NUMA|MHz' | tee -a "$LOG"
nvidia-smi topo -m 2>/dev/null | head -4 | tee -a "$LOG"
B=/tmp/h37cb
if [ ! -x $B/kvattn ]; then
  cmake -S $new -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a "${extra[@]}" >"$L/cmake.log" 2>&1 &&
    ninja -C $B -j16 kvattn bench_plan >"$L/build.log" 2>&1 ||
    { tail -20 "$L/build.log" | tee -a "$LOG"; exit 1; }
fi
row() { # label [taskset args]
  local tag=$1; shift
  "$@" $B/kvattn serve-sim --backend cuda --no-progress --plan-probe 1 >"$L/s.log" 2>&1
  say "$tag rc=$? $(grep -E 'plan share|plan probe' "$L/s.log" | sed -E 's/.*median us\): (total [0-9.]+ generic [0-9.]+).*(copy [0-9.]+).*/\1 \2/' | tr -s ' ' | tr '\n' ';')"
}
for r in $(seq 1 ${REPS:-2}); do
  row "r$r unpinned"
  for c in $(seq 0 $(( $(nproc) - 1 ))); do row "r$r core $c" taskset -c $c; done
done
