#!/usr/bin/env bash
# d256_ab.sh - one GPU call for the wgmma prefill at D 256 (issue 15): builds two
# source trees BASE and NEW (sm_90a only; bench_cuda in both, the two CUDA tests
# in NEW), runs the tests that cover the wgmma prefill in NEW (in parallel:
# test_cuda_prefill_mma full, compute-sanitizer memcheck of it in quick mode,
# test_cuda_attn's test_chunk, test_force_kernel and test_mma_mixed, and its
# quick test_grid; each under KVA_WG_TEST_TIMEOUT seconds, default 200), then
# bench_cuda on the prefill shapes, alternated base, new, base, new, then
# torch SDPA (flash, cuDNN) on the same machine (bench/prefill_sdpa_peer.py).
# Prints a table last.
# Usage: OUT=dir [KVA_DEBS=dir] [KVA_WG_TEST_TIMEOUT=s] bash dev/wg256/d256_ab.sh BASE NEW
set -uo pipefail
t_start=$(date +%s)
el() { echo $(( $(date +%s) - t_start )); }
base=$(cd "$1" && pwd); new=$(cd "$2" && pwd)
out=${OUT:-d256_out}; mkdir -p "$out"
bd=${KVA_AB_BUILD:-/tmp/wg256_ab}
log=$out/d256_ab.log
say() { echo "$@" | tee -a "$log"; }
cd "$new" && . scripts/device_deps.sh && cd - >/dev/null
extra=(${KVA_DEP_ARGS[@]+"${KVA_DEP_ARGS[@]}"})
say "$(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader)"
for t in base new; do
  d=${!t}
  tg="bench_cuda"; [ $t = new ] && tg="bench_cuda test_cuda_prefill_mma test_cuda_attn"
  ( cmake -S "$d" -B "$bd/$t" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90a "${extra[@]}" >"$bd.$t.cmake.log" 2>&1 &&
    ninja -C "$bd/$t" -j16 $tg >"$bd.$t.build.log" 2>&1; echo $? >"$bd.$t.rc" ) &
done
wait
for t in base new; do
  if [ "$(cat $bd.$t.rc)" != 0 ]; then tail -40 "$bd.$t.build.log" "$bd.$t.cmake.log"; exit 1; fi
  say "build $t ok at $(el) s; slowest CUDA objects:"
  awk '!/^#/ && $4 ~ /\.cu\.o$/ {printf "%7.1f s  %s\n", ($2-$1)/1000, $4}' "$bd/$t/.ninja_log" |
    sort -rn | head -4 | sed "s/^/  $t /" | tee -a "$log"
done
awk '!/^#/ && $4 ~ /prefill_wgmma.*\.cu\.o$/ {printf "  new %7.1f s  %s\n", ($2-$1)/1000, $4}' \
  "$bd/new/.ninja_log" | tee -a "$log"
# Tests (NEW), in parallel (the CPU reference is single-threaded): the full
# test_cuda_prefill_mma split by test function over three processes, its quick
# set under memcheck, and test_cuda_attn's tests that this branch changed.
N=$bd/new
TT=${KVA_WG_TEST_TIMEOUT:-200}
tp() { # name, env..., binary
  local n=$1; shift
  ( env KVA_TEST_TIMES=1 "$@" >"$bd.t_$n.log" 2>&1; echo "rc=$?" >>"$bd.t_$n.log" ) &
}
tp pf_a KVA_TEST_ONLY=test_host,test_edges,test_wgmma_tma,test_long timeout $TT "$N/test_cuda_prefill_mma"
tp pf_b KVA_TEST_ONLY=test_wgmma timeout $TT "$N/test_cuda_prefill_mma"
tp pf_c KVA_TEST_ONLY=test_grid timeout $TT "$N/test_cuda_prefill_mma"
tp memcheck KVA_TEST_QUICK=1 timeout $TT compute-sanitizer --tool memcheck --error-exitcode 9 \
  "$N/test_cuda_prefill_mma"
tp at_a KVA_TEST_ONLY=test_force_kernel,test_mma_mixed timeout $TT "$N/test_cuda_attn"
tp at_b KVA_TEST_ONLY=test_chunk timeout $TT "$N/test_cuda_attn"
tp at_c KVA_TEST_QUICK=1 KVA_TEST_ONLY=test_grid timeout $TT "$N/test_cuda_attn"
wait
for n in pf_a pf_b pf_c at_a at_b at_c memcheck; do echo "== $n"; cat "$bd.t_$n.log"; done >"$out/tests.log"
say "tests done at $(el) s"
for n in pf_a pf_b pf_c at_a at_b at_c memcheck; do
  say "$n: $(grep -iE 'passed|cases|wall|rc=|check failed|mismatch|ERROR SUMMARY' "$bd.t_$n.log" | head -12 | tr '\n' ' ')"
done
# Benchmarks: base, new, base, new.
P="--mode prefill --context 0 --iters 20"
shapes=(
  "$P --batch 1 --q-len 4096 --heads 16 --kv-heads 4 --head-dim 256"
  "$P --batch 8 --q-len 1024 --heads 16 --kv-heads 4 --head-dim 256"
  "--mode prefill --iters 20 --batch 4 --context 3072 --q-len 1024 --heads 16 --kv-heads 4 --head-dim 256"
  "$P --batch 1 --q-len 4096"
  "$P --batch 1 --q-len 4096 --head-dim 64"
  "$P --batch 1 --q-len 4096 --heads 16 --kv-heads 4 --head-dim 256 --kernel prefill_wgmma_sm90"
)
for round in 1 2; do
  for t in base new; do
    for i in "${!shapes[@]}"; do
      [ $t = base ] && [ $i = 5 ] && continue
      line=$("$bd/$t/bench_cuda" ${shapes[$i]} 2>&1 >/dev/null | grep "^bench_cuda:" | head -1)
      echo "$t r$round s$i ${shapes[$i]} | $line" >>"$out/bench_raw.log"
      echo "$t r$round s$i $(echo "$line" | grep -oE 'median [0-9.]+ ms|[0-9.]+ TFLOP/s|check [a-zA-Z]+|back to back [0-9.]+ ms' | tr '\n' ' ')" | tee -a "$log"
    done
  done
done
say "bench done at $(el) s"
( cd "$new" && timeout 120 python3 bench/prefill_sdpa_peer.py ) >"$out/sdpa_peer.log" 2>&1
say "sdpa peer (rc $?) at $(el) s:"; tee -a "$log" <"$out/sdpa_peer.log" | tail -12
# Table: medians of the two rounds per shape.
say "== table (median ms of r1, r2; TFLOP/s of the faster)"
for i in "${!shapes[@]}"; do
  for t in base new; do
    v=$(grep -E "^$t r[12] s$i " "$log" | grep -oE 'median [0-9.]+' | awk '{print $2}' | tr '\n' ' ')
    f=$(grep -E "^$t r[12] s$i " "$log" | grep -oE '[0-9.]+ TFLOP/s' | sort -rn | head -1)
    [ -n "$v" ] && say "s$i $t: $v ms  $f   (${shapes[$i]})"
  done
done
