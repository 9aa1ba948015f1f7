#!/usr/bin/env bash
# dev/mla29/ab.sh - one device call for the MLA wgmma split-key loop (issue 16):
# from a folder holding base/ (main) and new/ (this branch), builds new/ and
# links base's MLA kernels beside it (bench/mla_ab_cuda.sh), compiles the
# knob variants of new's dense kernel (VARIANTS="name:-Dflags ...", default
# pf, ordpf, mainpf: see VARIANTS below) into bench_cuda_mla_<name>, runs
# the MLA tests quick (+ memcheck of test_cuda_mla quick), then the dense rows
# base, new, variants alternated KVA_ROUNDS times, the sparse suite once per
# side (base, new), a table last.
# new/ must be a tree at commit 9a7ce5c (the early-S loop with its knobs).
#   usage (device): cd .dev/mla29 && OUT=$OUT bash new/dev/mla29/ab.sh
set -u
o=${OUT:-/tmp/out}
mkdir -p "$o"
t0=$(date +%s)
el() { echo $(($(date +%s) - t0)); }
V=${VARIANTS:-"pf:-DMW_SPLIT_PF=1 ordpf:-DMW_SPLIT_ORD=1,-DMW_SPLIT_PF=1 mainpf:-DMW_SPLIT_EARLY=0,-DMW_SPLIT_PF=1"}
cd "$(dirname "$0")/../.."   # new/
(BASE=../base OUT="$o/ab" KVA_STEPS=none bash bench/mla_ab_cuda.sh) 2>&1 | tee "$o/log.txt"
[ -x b/bench_cuda_mla ] && [ -x b/bench_cuda_mla_base ] || { echo "no binaries"; exit 1; }
# Variant objects (in parallel with the tests below).
for v in $V; do
  n=${v%%:*}; f=${v#*:}
  mkdir -p "bo_$n"
  nvcc -DKVA_CUDA_SM90A=1 -DKVA_HAVE_CUDA=1 -DKVA_VERSION_STRING=\"0.1.0\" -Iinclude -Isrc/core \
    -Isrc/plan -O3 -DNDEBUG --generate-code=arch=compute_90a,code=[compute_90a,sm_90a] \
    -Xcompiler=-fPIC -Xcompiler=-fvisibility=hidden -std=c++17 ${f//,/ } -Xptxas -v -x cu -c \
    src/attn/cuda/mla_decode_wgmma.cu -o "bo_$n/mla_decode_wgmma.cu.o" >"$o/ab/l/cc_$n.log" 2>&1 &
done
for t in test_cuda_mla test_cuda_mla_run test_cuda_mla_sparse test_cuda_graph; do
  (KVA_TEST_QUICK=1 timeout 150 b/$t >"$o/ab/l/$t.log" 2>&1
    echo "$t quick rc=$?: $(grep -E 'passed|FAILED|CHECK failed' "$o/ab/l/$t.log" | tail -1 | cut -c1-120)") &
done
wait
grep -hE "FAILED|CHECK failed" "$o"/ab/l/test_cuda_*.log | head -10
echo "== tests + variant objects $(el) s" | tee -a "$o/log.txt"
sides="base mine"
for v in $V; do
  n=${v%%:*}
  cp bd/libkvattn.a "bo_$n/lib.a" && (cd "bo_$n" && ar r lib.a mla_decode_wgmma.cu.o) || continue
  cmd=$(cd bd && ninja -t commands bench_cuda_mla | tail -1)
  cmd=${cmd//libkvattn.a/..\/bo_$n\/lib.a}
  cmd=$(echo "$cmd" | sed -E "s# -o bench_cuda_mla( |\$)# -o ../b/bench_cuda_mla_$n #")
  (cd bd && eval "$cmd") >"$o/ab/l/link_$n.log" 2>&1 && sides="$sides $n" || echo "link $n failed"
  grep -E "registers|spill|C75" "$o/ab/l/cc_$n.log" | grep -B1 -A0 "spill" | head -4
done
if [ "${KVA_MEMCHECK:-1}" = 1 ]; then
  KVA_TEST_QUICK=1 timeout 150 compute-sanitizer --tool memcheck b/test_cuda_mla >"$o/ab/l/memcheck.log" 2>&1
  echo "memcheck test_cuda_mla quick rc=$?: $(grep -E 'ERROR SUMMARY' "$o/ab/l/memcheck.log" | tail -1)" | tee -a "$o/log.txt"
fi
ROWS=("H128 q1 4k|--batch 128 --context 4096 --heads 128"
  "H128 q2 8k|--batch 128 --context 8192 --heads 128 --q-len 2"
  "H128 q2 8k fp8|--batch 128 --context 8192 --heads 128 --q-len 2 --kv-quant fp8"
  "H128 q1 4k fp8|--batch 128 --context 4096 --heads 128 --kv-quant fp8"
  "H16 16k|--batch 128 --context 16384 --heads 16")
for r in $(seq 1 "${KVA_ROUNDS:-2}"); do
  for s in $sides; do
    x=""; [ $s != mine ] && x=_$s
    for m in "${ROWS[@]}"; do
      nm=${m%%|*}
      [[ $s != base && $s != mine && $nm == *fp8* ]] && continue   # variants: 16-bit rows only
      [[ $nm == H16* || $nm == *"q1 4k fp8" ]] && [ "$r" != 1 ] && continue
      chk=0; [ "$r" = 1 ] && [ $s != base ] && chk=1
      j=$(timeout 60 b/bench_cuda_mla$x ${m#*|} --iters 30 --check $chk 2>>"$o/ab/l/bench.err" | tail -1)
      echo "r$r $s $nm: $(echo "$j" | grep -oE '"ms": [0-9.]+|"tflops": [0-9.]+|"check_bad": [-0-9]+' | tr '\n' ' ')"
    done
  done
done | tee -a "$o/log.txt"
echo "== bench $(el) s" | tee -a "$o/log.txt"
if [ "${KVA_SUITE:-1}" = 1 ]; then
  for s in base mine; do
    x=""; [ $s = base ] && x=_base
    timeout 120 b/kvattn$x bench --mla-sparse --backend cuda --iters 20 >"$o/ab/l/suite_$s.log" 2>&1
    echo "== sparse suite $s rc=$?" | tee -a "$o/log.txt"
    grep -E "ms" "$o/ab/l/suite_$s.log" | tr -s ' ' | head -20 | tee -a "$o/log.txt"
  done
fi
tar -czf "$o/logs.tgz" -C "$o/ab" l
rm -rf "$o/ab"
echo "== end $(el) s"
echo "== table (ms; $(nvidia-smi --query-gpu=name --format=csv,noheader))"
grep -E "^r[0-9]" "$o/log.txt" | sed -E 's/"ms": ([0-9.]+).*/\1/' | sort -t: -k1,1 -s
