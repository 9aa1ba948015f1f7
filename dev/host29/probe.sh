#!/usr/bin/env bash
# probe.sh - issue 23's first question (host29): where does the CUDA plan's
# time go inside serve-sim's step? Builds one tree (kvattn, bench_plan; sm_90a)
# and runs serve-sim --backend cuda (default workload) with --plan-probe
# 1 (phases), 2 (a stream query before the plan) and 3 (the same plan again
# right after: warm caches), plain serve-sim, and bench_plan's back-to-back
# CUDA update and --between 20.
# Usage: KVA_DEBS=$PWD/debs OUT=... bash new/dev/host29/probe.sh new
set -uo pipefail
new=$(cd "$1" && pwd)
out=${OUT:-$PWD/out}; mkdir -p "$out"; LOG=$out/probe.txt; L=/tmp/h29logs; mkdir -p $L
. "$new/scripts/device_deps.sh"; extra=(${KVA_DEP_ARGS[@]+"${KVA_DEP_ARGS[@]}"})
say() { echo "$*" | tee -a "$LOG"; }
pack() { tar -czf "$out/logs.tgz" -C $L . 2>/dev/null; }
say "# gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"
say "# host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)"
B=/tmp/h29b; t0=$(date +%s); T() { say "## $1: $(( $(date +%s) - t0 )) s"; }
cmake -S $new -B $B/new -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a "${extra[@]}" >"$L/cmake.log" 2>&1 ||
  { tail -20 "$L/cmake.log" | tee -a "$LOG"; pack; exit 1; }
ninja -C $B/new -j16 kvattn bench_plan >"$L/build.log" 2>&1 ||
  { grep -m20 -B2 -A6 error "$L/build.log" | tee -a "$LOG"; pack; exit 1; }
T build
K=$B/new/kvattn
for r in 1 2; do
  for m in 0 1 2 3; do
    $K serve-sim --backend cuda --no-progress --plan-probe $m >"$L/serve_$m.$r.log" 2>&1
    say "r$r probe$m rc=$? $(grep -E 'plan share|Mean step' "$L/serve_$m.$r.log" | tr -s ' ' | tr '\n' ';')"
    grep 'plan probe' "$L/serve_$m.$r.log" | tee -a "$LOG"
  done
  say "r$r $($B/new/bench_plan --iters 101 2>&1 | grep 'serve-sim default')"
  say "r$r-between $($B/new/bench_plan --iters 101 --between 20 2>&1 | grep 'serve-sim default')"
  T "round $r"
done
pack
