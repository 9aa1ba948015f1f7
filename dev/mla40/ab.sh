#!/usr/bin/env bash
# dev/mla40/ab.sh - one device call for issue 16 (branch mla40): the MLA
# wgmma decode's CUDA-core work between the wgmmas. From a folder holding
# base/ (main) and new/ (this branch), builds new/, compiles main's
# mla_decode_wgmma.cu ("base") and, for each side in KVA_VARS, new's with
# that side's -D switches, and links bench_cuda_mla / test_cuda_mla beside
# new's with them (the other objects are new's; the sparse kernel's SASS
# equals main's up to two swapped registers). Then the tests (new:
# test_cuda_mla whole, test_cuda_mla_run and test_cuda_mla_sparse quick; the
# variants: test_cuda_mla quick), the rows alternated side by side
# KVA_ROUNDS (2) times: bf16 H 128 q 2 8k (the issue's row) for every side;
# bf16 q 1 4k, FP8 q 1 4k and bf16 q 1 64k (B 32) for base and new (odd
# rounds base first, even rounds new first); round 1 checks request 0 of
# every non-base side against the reference (not at 64k: the host reference
# would take seconds). While time is left: Nsight Compute (real clocks)
# metrics of one q 2 8k launch of new and base, the source-level stall
# samples of new (dev/mla39/ncu_src.py reads them), and memcheck of new's
# test_cuda_mla quick. Raw logs in $OUT/logs.tgz, the table last.
#   usage (device): cd .dev/X && OUT=$OUT bash new/dev/mla40/ab.sh
#   KVA_VARS   variant sides (default none: base against new). The measured
#              call (bench/results/h200_2026-11-28_mla40.txt) ran branch
#              mla40-variants, whose src still has the switches, with
#              KVA_VARS="noF noV noS noT noE pexp" (its default there): new
#              with KVA_MW_FOLD / _VOTE / _STSM / _TROW / _EMAX = 0, or with
#              KVA_MW_PEXP = 1; on this branch those switches are gone.
#   KVA_ROUNDS rounds (default 2); KVA_NCU=0 skips Nsight Compute
set -u
o=${OUT:-/tmp/out}
mkdir -p "$o/l"
cd "$(dirname "$0")/../.."   # new/
base=../base
t0=$(date +%s)
el() { echo $(($(date +%s) - t0)); }
VARS=${KVA_VARS-}
knobs() { case $1 in noF) echo "-DKVA_MW_FOLD=0" ;; noV) echo "-DKVA_MW_VOTE=0" ;;
  noS) echo "-DKVA_MW_STSM=0" ;; noT) echo "-DKVA_MW_TROW=0" ;; noE) echo "-DKVA_MW_EMAX=0" ;;
  pexp) echo "-DKVA_MW_PEXP=1" ;; esac; }
gpu=$(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | head -1)
echo "gpu: $gpu; nvcc $(nvcc --version | grep -oE 'V[0-9.]+'); nproc $(nproc)" | tee "$o/log.txt"
cmake -S . -B bd -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DCMAKE_CUDA_FLAGS=-lineinfo -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF -DKVA_WITH_CJSON=OFF \
  -DKVA_WITH_MPI=OFF -DKVA_WITH_NCCL=OFF >"$o/l/cfg.log" 2>&1 || { tail "$o/l/cfg.log"; exit 1; }
NV="-DKVA_CUDA_SM90A=1 -DKVA_HAVE_CUDA=1 -DKVA_VERSION_STRING=\"0.1.0\" -O3 -DNDEBUG -lineinfo
  --generate-code=arch=compute_90a,code=[compute_90a,sm_90a] -Xcompiler=-fPIC
  -Xcompiler=-fvisibility=hidden -std=c++17 -Xptxas -v -x cu"
mkdir -p bo/base b
nvcc $NV -I$base/include -I$base/src/core -I$base/src/plan -c "$base/src/attn/cuda/mla_decode_wgmma.cu" \
  -o bo/base/mla_decode_wgmma.cu.o >"$o/l/ptxas_base.log" 2>&1 &
for v in $VARS; do
  mkdir -p bo/$v
  nvcc $NV -Iinclude -Isrc/core -Isrc/plan $(knobs $v) -c src/attn/cuda/mla_decode_wgmma.cu \
    -o bo/$v/mla_decode_wgmma.cu.o >"$o/l/ptxas_$v.log" 2>&1 &
done
T="bench_cuda_mla test_cuda_mla test_cuda_mla_run test_cuda_mla_sparse"
timeout 300 ninja -C bd -j"$(nproc)" $T >"$o/l/build.log" 2>&1 ||
  { echo "BUILD FAILED"; grep -E "error" "$o/l/build.log" | head -20; tar -czf "$o/logs.tgz" -C "$o" l; exit 1; }
wait
echo "== built $(el) s" | tee -a "$o/log.txt"
for v in base $VARS; do
  echo "ptxas $v (bf16 TMA): $(grep -A3 'Compiling entry.*bf16.*mw_denseI.*Lb0ELb1E' "$o/l/ptxas_$v.log" | grep -oE 'Used [0-9]+ registers|[0-9]+ bytes spill stores' | tr '\n' ' ') C75xx: $(grep -c C75 "$o/l/ptxas_$v.log")" | tee -a "$o/log.txt"
done
cp bd/bench_cuda_mla bd/test_cuda_mla bd/test_cuda_mla_run bd/test_cuda_mla_sparse b/
for v in base $VARS; do
  cp bd/libkvattn.a bo/$v/libkvattn_v.a && (cd bo/$v && ar r libkvattn_v.a mla_decode_wgmma.cu.o) || echo "archive $v failed"
  for n in bench_cuda_mla test_cuda_mla; do
    cmd=$(cd bd && ninja -t commands $n | tail -1)
    cmd=${cmd//libkvattn.a/..\/bo\/$v\/libkvattn_v.a}
    cmd=$(echo "$cmd" | sed -E "s# -o $n( |\$)# -o ../b/${n}_$v #")
    (cd bd && eval "$cmd") >"$o/l/link_${n}_$v.log" 2>&1 || { echo "link $n $v failed"; head -c 400 "$o/l/link_${n}_$v.log"; }
  done
done
echo "== linked $(el) s" | tee -a "$o/log.txt"
sfx() { [ $1 = new ] && echo "" || echo "_$1"; }
OK=""
for v in base $VARS new; do
  (timeout 20 b/bench_cuda_mla$(sfx $v) --batch 8 --context 1000 --heads 128 --iters 2 >"$o/l/smoke_$v.log" 2>&1
    echo $? >"$o/l/smoke_$v.rc") &
done
wait
for v in base $VARS new; do
  rc=$(cat "$o/l/smoke_$v.rc")
  echo "smoke $v rc=$rc: $(tail -1 "$o/l/smoke_$v.log" | grep -oE '"ms": [0-9.]+|"check_bad": [-0-9]+' | tr '\n' ' ')" | tee -a "$o/log.txt"
  [ "$rc" = 0 ] && OK="$OK $v"
done
(if [[ " $OK " == *" new "* ]]; then
  # new: test_cuda_mla whole (its spike cases move the lazy reference: the
  # vote's rare path), the others quick
  (timeout 100 b/test_cuda_mla >"$o/l/test_cuda_mla.log" 2>&1
    echo "test_cuda_mla full (new) rc=$?: $(grep -E 'passed|FAILED|CHECK failed' "$o/l/test_cuda_mla.log" | tail -1 | cut -c1-120)") &
  for t in test_cuda_mla_run test_cuda_mla_sparse; do
    (KVA_TEST_QUICK=1 timeout 60 b/$t >"$o/l/$t.log" 2>&1
      echo "$t quick (new) rc=$?: $(grep -E 'passed|FAILED|CHECK failed' "$o/l/$t.log" | tail -1 | cut -c1-120)") &
  done
fi
for v in $VARS; do
  [[ " $OK " == *" $v "* ]] || continue
  (KVA_TEST_QUICK=1 timeout 60 b/test_cuda_mla_$v >"$o/l/test_cuda_mla_$v.log" 2>&1
    echo "test_cuda_mla quick ($v) rc=$?: $(grep -E 'passed|FAILED|CHECK failed' "$o/l/test_cuda_mla_$v.log" | tail -1 | cut -c1-120)") &
done
wait) 2>&1 | tee -a "$o/log.txt"
echo "== tests $(el) s" | tee -a "$o/log.txt"
IROW="bf16 q2 8k|--batch 128 --context 8192 --heads 128 --q-len 2 --block-size 64"
ROWS=("bf16 q1 4k|--batch 128 --context 4096 --heads 128 --block-size 64"
  "fp8 q1 4k|--batch 128 --context 4096 --heads 128 --kv-quant fp8"
  "bf16 q1 64k|--batch 32 --context 65536 --heads 128 --block-size 64")
bench1() { # row, sides...
  local m=$1; shift
  for v in "$@"; do
    [[ " $OK " == *" $v "* ]] || continue
    chk=0; [ $r = 1 ] && [ $v != base ] && [[ "$m" != *65536* ]] && chk=1
    j=$(timeout 60 b/bench_cuda_mla$(sfx $v) ${m#*|} --iters 30 --check $chk 2>>"$o/l/bench.err" | tail -1)
    echo "r$r ${m%%|*} $v: $(echo "$j" | grep -oE '"ms": [0-9.]+|"tflops": [0-9.]+|"check_bad": [-0-9]+' | tr '\n' ' ')"
  done
}
SIDES="base $VARS new"
RSIDES=$(echo $SIDES | tr ' ' '\n' | tac | tr '\n' ' ')
for r in $(seq 1 "${KVA_ROUNDS:-2}"); do
  # odd rounds base first, even rounds new first
  if [ $((r % 2)) = 1 ]; then S=$SIDES; S2="base new"; else S=$RSIDES; S2="new base"; fi
  bench1 "$IROW" $S
  for m in "${ROWS[@]}"; do bench1 "$m" $S2; done
  echo "== round $r $(el) s" >&2
done 2>&1 | tee "$o/bench.txt"
echo "== bench $(el) s" | tee -a "$o/log.txt"
Q2="--batch 128 --heads 128 --context 8192 --q-len 2 --block-size 64 --iters 2 --check 0"
M="gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct"
M="$M,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum"
for s in long_scoreboard barrier short_scoreboard mio_throttle wait math_pipe_throttle no_instruction selected not_selected branch_resolving; do
  M="$M,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio"
done
ncu1() { # side
  timeout 40 ncu --clock-control none --metrics "$M" -k regex:mla_wgmma --launch-skip 1 \
    --launch-count 1 b/bench_cuda_mla$(sfx $1) $Q2 >"$o/l/ncu_$1.raw" 2>&1
  echo "== ncu q2 8k $1 rc=$?"
  grep -E "__" "$o/l/ncu_$1.raw" | awk '{print $1, $(NF-1), $NF}'
}
if [ "${KVA_NCU:-1}" = 1 ] && [ "$(el)" -lt 120 ]; then ncu1 new; ncu1 base; fi 2>&1 | tee "$o/ncu.txt"
if [ "${KVA_NCU:-1}" = 1 ] && [ "$(el)" -lt 128 ]; then
  timeout 40 ncu --clock-control none --section SourceCounters --section WarpStateStats \
    --import-source yes -k regex:mla_wgmma --launch-skip 1 --launch-count 1 -o /tmp/src_new \
    b/bench_cuda_mla $Q2 >"$o/l/ncu_src_new.log" 2>&1
  echo "== ncu source new rc=$?" | tee -a "$o/ncu.txt"
  ncu -i /tmp/src_new.ncu-rep --page source --csv --print-source sass >"$o/l/src_new_sass.csv" 2>&1
  python3 dev/mla39/ncu_src.py "$o/l/src_new_sass.csv" 25 >"$o/ncu_src.txt" 2>&1 || true
  gzip -f "$o/l/src_new_sass.csv"
fi
echo "== ncu $(el) s" | tee -a "$o/log.txt"
if [ "$(el)" -lt 138 ]; then
  KVA_TEST_QUICK=1 timeout 45 compute-sanitizer --tool memcheck b/test_cuda_mla >"$o/l/memcheck.log" 2>&1
  echo "memcheck test_cuda_mla quick (new) rc=$?: $(grep -E 'ERROR SUMMARY' "$o/l/memcheck.log" | tail -1)" | tee -a "$o/log.txt"
else
  echo "memcheck skipped at $(el) s" | tee -a "$o/log.txt"
fi
tar -czf "$o/logs.tgz" -C "$o" l && rm -rf "$o/l"
echo "== end $(el) s" | tee -a "$o/log.txt"
echo "== table (ms; $gpu)"
grep -E "ptxas|test_cuda|smoke|memcheck|==" "$o/log.txt"
sort -s -k2,4 "$o/bench.txt" | grep -E "^r"
grep -E "gpu__time|dram__bytes|tensor_op|inst_executed|==|source" "$o/ncu.txt"
