#!/usr/bin/env bash
# mla_ab_cuda.sh - on a machine with an NVIDIA GPU (sm_90a): the MLA decode of
# this tree ("mine") against a base tree's MLA kernels ("base") in one call.
# Builds this tree (Release, sm_90a, no optional dependencies), compiles the
# base tree's MLA kernel files (BASE/src/attn/cuda/<f>.cu for f in
# KVA_BASE_FILES) and relinks bench_cuda_mla and kvattn with them (*_base),
# so both sides share every other object. Then: the quick MLA tests, the
# copy ceiling (1 GiB device-to-device, torch), the dense rows of issue 16 and
# the sparse decode row of issue 17, base and mine alternated KVA_ROUNDS
# times (mine's request 0 checked against the reference backend in the first
# round; both sides on the small smoke shape),
# and optionally Nsight Compute on one shape of each side. A table last.
#   BASE              base tree (default base: a copy of main's src/ and include/)
#   KVA_BASE_FILES    default "mla_decode_mma mla_decode_wgmma mla_sparse mla_sparse_wgmma"
#   KVA_STEPS         default "test bench"; also "ncu", "memcheck", "graph", "suite"
#                     (the whole `kvattn bench --mla-sparse` suite, base then mine, once)
#   KVA_ROUNDS        default 2
#   KVA_SHAPES        bash regex of the dense rows' names to run (default all;
#                     e.g. "H128" skips the H 16 rows, which run mma.sync)
#   KVA_NCU_ARGS      bench_cuda_mla arguments of the ncu shape (default H 16, 16k)
#   OUT               logs (default /tmp/out); l/ holds the raw logs, tarred at the end
set -u
cd "$(dirname "$0")/.."
t0=$(date +%s)
el() { echo $(($(date +%s) - t0)); }
o=${OUT:-/tmp/out}
mkdir -p "$o/l"
base=${BASE:-base}
steps=" ${KVA_STEPS:-test bench} "
has() { [[ "$steps" == *" $1 "* ]]; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$o/l/gpu.txt"
cmake -S . -B bd -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF -DKVA_WITH_CJSON=OFF -DKVA_WITH_MPI=OFF \
  -DKVA_WITH_NCCL=OFF >"$o/l/cfg.log" 2>&1 || { tail "$o/l/cfg.log"; exit 1; }
T="bench_cuda_mla kvattn_cli test_cuda_mla test_cuda_mla_run test_cuda_mla_sparse test_cuda_graph"
mkdir -p bo b
for f in ${KVA_BASE_FILES:-mla_decode_mma mla_decode_wgmma mla_sparse mla_sparse_wgmma}; do
  nvcc -DKVA_CUDA_SM90A=1 -DKVA_HAVE_CUDA=1 -DKVA_VERSION_STRING=\"0.1.0\" -I"$base/include" \
    -I"$base/src/core" -I"$base/src/plan" -O3 -DNDEBUG \
    --generate-code=arch=compute_90a,code=[compute_90a,sm_90a] -Xcompiler=-fPIC \
    -Xcompiler=-fvisibility=hidden -std=c++17 -x cu -c "$base/src/attn/cuda/$f.cu" \
    -o "bo/$f.cu.o" >"$o/l/base_$f.log" 2>&1 &
done
timeout 420 ninja -C bd -j"$(nproc)" $T >"$o/l/build.log" 2>&1 ||
  { echo "BUILD FAILED"; grep -E "error" "$o/l/build.log" | head -20; exit 1; }
wait
echo "== built $(el) s"
cp bd/bench_cuda_mla bd/kvattn bd/test_cuda_mla bd/test_cuda_mla_run bd/test_cuda_mla_sparse \
  bd/test_cuda_graph b/
cp bd/libkvattn.a bo/libkvattn_base.a && (cd bo && ar r libkvattn_base.a *.cu.o) ||
  echo "base archive failed"
for t in bench_cuda_mla kvattn_cli; do
  n=$t; [ $t = kvattn_cli ] && n=kvattn
  cmd=$(cd bd && ninja -t commands $t | tail -1)
  cmd=${cmd//libkvattn.a/..\/bo\/libkvattn_base.a}
  cmd=$(echo "$cmd" | sed -E "s# -o $n( |\$)# -o ../b/${n}_base #")
  (cd bd && eval "$cmd") >"$o/l/link_$n.log" 2>&1 || { echo "base link $n failed"; head -c 600 "$o/l/link_$n.log"; }
done
echo "== base linked $(el) s"
# A hang shows here in seconds.
timeout 20 b/bench_cuda_mla --batch 8 --context 1000 --heads 128 --iters 2 >"$o/l/smoke.log" 2>&1
rc=$?
echo "smoke mine rc=$rc: $(tail -1 "$o/l/smoke.log" | grep -oE '"ms": [0-9.]+|"check_bad": [-0-9]+' | tr '\n' ' ')"
# A hanging or failing kernel would eat every later step's timeout: stop here.
[ $rc = 0 ] || { tail -5 "$o/l/smoke.log"; tar -czf "$o/logs.tgz" -C "$o" l; exit 1; }
timeout 20 b/bench_cuda_mla_base --batch 8 --context 1000 --heads 128 --iters 2 >"$o/l/smoke_base.log" 2>&1
echo "smoke base rc=$?: $(tail -1 "$o/l/smoke_base.log" | grep -oE '"ms": [0-9.]+|"check_bad": [-0-9]+' | tr '\n' ' ')"
if has test; then
  for t in test_cuda_mla test_cuda_mla_run test_cuda_mla_sparse test_cuda_graph; do
    (KVA_TEST_QUICK=1 timeout 120 b/$t >"$o/l/$t.log" 2>&1
      echo "$t quick rc=$?: $(grep -E 'passed|FAILED|CHECK failed' "$o/l/$t.log" | tail -1 | cut -c1-120)") &
  done
  wait
  grep -hE "FAILED|CHECK failed" "$o"/l/test_cuda_*.log | head -10
  echo "== tests $(el) s"
fi
if has memcheck; then
  KVA_TEST_QUICK=1 timeout 200 compute-sanitizer --tool memcheck b/test_cuda_mla >"$o/l/memcheck.log" 2>&1
  echo "memcheck test_cuda_mla quick rc=$?: $(grep -E 'ERROR SUMMARY' "$o/l/memcheck.log" | tail -1)"
fi
copy_tbs() {
  timeout 60 python3 -c '
import torch
n = 1 << 30
x = torch.empty(n, dtype=torch.uint8, device="cuda").fill_(7); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
ms = []
for _ in range(20):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); y.copy_(x); b.record(); b.synchronize(); ms.append(a.elapsed_time(b))
ms.sort(); print("%.3f" % (2.0 * n / (ms[10] * 1e-3) * 1e-12))' 2>"$o/l/copy.err"
}
SHAPES=("H16 4k|--batch 128 --context 4096 --heads 16"
  "H16 16k|--batch 128 --context 16384 --heads 16"
  "H16 32k|--batch 64 --context 32768 --heads 16"
  "H128 q1 4k|--batch 128 --context 4096 --heads 128"
  "H128 q2 8k|--batch 128 --context 8192 --heads 128 --q-len 2"
  "H128 q1 4k fp8|--batch 128 --context 4096 --heads 128 --kv-quant fp8"
  "H128 q2 8k fp8|--batch 128 --context 8192 --heads 128 --q-len 2 --kv-quant fp8")
SPARSE="--batch 128 --q-len 2 --context 8192 --heads 128 --topk 2048"
if has bench; then
  c0=$(copy_tbs)
  echo "copy ceiling $c0 TB/s"
  for r in $(seq 1 "${KVA_ROUNDS:-2}"); do
    for v in base mine; do
      s=""; [ $v = base ] && s=_base
      chk=0; [ "$r" = 1 ] && [ $v = mine ] && chk=1
      for m in "${SHAPES[@]}"; do
        [[ "${m%%|*}" =~ ${KVA_SHAPES:-.} ]] || continue
        j=$(timeout 60 b/bench_cuda_mla$s ${m#*|} --iters 30 --check $chk 2>>"$o/l/bench_$v.err" | tail -1)
        echo "r$r $v ${m%%|*}: $(echo "$j" | grep -oE '"ms": [0-9.]+|"check_bad": [-0-9]+|"items": [0-9]+|"tasks": [0-9]+' | tr '\n' ' ')"
      done
      echo "r$r $v sparse: $(timeout 60 b/kvattn$s bench --mla-sparse --backend cuda --iters 20 $SPARSE 2>&1 | grep -E 'ms' | tail -1 | tr -s ' ')"
    done
  done | tee "$o/l/bench.log"
  c1=$(copy_tbs)
  echo "copy ceiling after $c1 TB/s"
  echo "== bench $(el) s"
fi
if has suite; then
  for v in base mine; do
    s=""; [ $v = base ] && s=_base
    timeout 120 b/kvattn$s bench --mla-sparse --backend cuda --iters 20 >"$o/l/suite_$v.log" 2>&1
    echo "== sparse suite $v rc=$?"
    grep -E "ms" "$o/l/suite_$v.log" | tr -s ' ' | head -20
  done
fi
if has ncu; then
  na=${KVA_NCU_ARGS:---batch 128 --context 16384 --heads 16}
  for v in base mine; do
    s=""; [ $v = base ] && s=_base
    timeout 90 ncu --clock-control none --section SpeedOfLight \
      --section WarpStateStats --section Occupancy \
      --metrics dram__bytes_read.sum,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio \
      -k regex:mla_decode --launch-skip 2 --launch-count 1 b/bench_cuda_mla$s $na --iters 3 --check 0 \
      >"$o/l/ncu_$v.txt" 2>&1
    echo "== ncu $v rc=$?"
    grep -E "Duration|DRAM Throughput|Memory Throughput|dram__bytes|L2 Hit|Registers Per|Dynamic Shared|Achieved Occ|Warp Cycles Per Issued|issue_stalled" "$o/l/ncu_$v.txt" | tr -s ' ' | head -16
  done
fi
tar -czf "$o/logs.tgz" -C "$o" l
echo "== end $(el) s"
