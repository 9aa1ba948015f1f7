#!/usr/bin/env bash
# dev/mlaws29/verify.sh - GPU check of branch mlaws29 (the MLA wgmma body's
# key-loop schedule as a policy trait: FP8 latent cache and fp8_ds_mla on
# the alternating-tile loop, 16-bit rows on main's split-key loop) from two
# trees that are already built: NEW (this branch, merged) and BASE (main).
# No build here. Logs go to $OUT progressively; a table is printed last.
#   NB=<new build dir> BB=<base build dir> OUT=<dir> bash dev/mlaws29/verify.sh
# NB / BB: folders holding test_cuda_mla, test_cuda_mla_run,
# test_cuda_mla_sparse, bench_cuda_mla and kvattn (default: found under
# /tmp/fb/new and /tmp/fb/base). KVA_MEMCHECK=0 skips memcheck;
# KVA_ROUNDS (default 2) base/new alternations of the timed rows.
set -u
o=${OUT:-/tmp/out}/mlaws29
mkdir -p "$o"
fnd() { dirname "$(find "$1" -maxdepth 3 -type f -name bench_cuda_mla | head -1)"; }
NB=${NB:-$(fnd /tmp/fb/new)}
BB=${BB:-$(fnd /tmp/fb/base)}
log="$o/verify.txt"
say() { echo "$*" | tee -a "$log"; }
say "# mlaws29 verify: new $NB, base $BB; $(nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader)"
for t in test_cuda_mla test_cuda_mla_run test_cuda_mla_sparse; do
  KVA_TEST_QUICK=1 timeout 150 "$NB/$t" >"$o/$t.log" 2>&1
  say "$t quick rc=$?: $(grep -E 'passed|FAILED|CHECK failed' "$o/$t.log" | tail -1 | cut -c1-120)"
done
ROWS=("H128 q1 4k bf16|--batch 128 --context 4096 --heads 128"
  "H128 q2 8k bf16|--batch 128 --context 8192 --heads 128 --q-len 2"
  "H128 q1 4k fp8|--batch 128 --context 4096 --heads 128 --kv-quant fp8"
  "H128 q2 8k fp8|--batch 128 --context 8192 --heads 128 --q-len 2 --kv-quant fp8")
SPARSE="--batch 128 --q-len 2 --context 8192 --heads 128 --topk 2048"
for r in $(seq 1 "${KVA_ROUNDS:-2}"); do
  for v in base new; do
    d=$BB; [ $v = new ] && d=$NB
    chk=0; [ "$r" = 1 ] && [ $v = new ] && chk=1
    for m in "${ROWS[@]}"; do
      j=$(timeout 60 "$d/bench_cuda_mla" ${m#*|} --iters 30 --check $chk 2>>"$o/bench.err" | tail -1)
      say "r$r $v ${m%%|*}: $(echo "$j" | grep -oE '"ms": [0-9.]+|"check_bad": [-0-9]+' | tr '\n' ' ')"
    done
    say "r$r $v sparse fp8_ds_mla decode q2 topk 2048: $(timeout 60 "$d/kvattn" bench --mla-sparse \
      --backend cuda --iters 20 $SPARSE 2>&1 | grep -E 'ms' | tail -1 | tr -s ' ')"
  done
done
for v in base new; do
  d=$BB; [ $v = new ] && d=$NB
  timeout 120 "$d/kvattn" bench --mla-sparse --backend cuda --iters 20 >"$o/suite_$v.log" 2>&1
  say "== sparse suite $v rc=$?"
  grep -E "ms" "$o/suite_$v.log" | tr -s ' ' | head -20 | tee -a "$log"
done
if [ "${KVA_MEMCHECK:-1}" = 1 ]; then
  KVA_TEST_QUICK=1 timeout 200 compute-sanitizer --tool memcheck "$NB/test_cuda_mla" \
    >"$o/memcheck.log" 2>&1
  say "memcheck test_cuda_mla quick rc=$?: $(grep -E 'ERROR SUMMARY' "$o/memcheck.log" | tail -1)"
fi
say "## table: ms per round, base then new (check_bad of new r1 above must be 0; sparse rows \"check ok\")"
for m in "${ROWS[@]}" "sparse fp8_ds_mla decode q2 topk 2048|"; do
  n=${m%%|*}
  b=$(grep -E "^r[0-9]+ base $n:" "$log" | grep -oE '"ms": [0-9.]+|[0-9.]+ ms' | grep -oE '[0-9.]+' | head -9 | tr '\n' ' ')
  w=$(grep -E "^r[0-9]+ new $n:" "$log" | grep -oE '"ms": [0-9.]+|[0-9.]+ ms' | grep -oE '[0-9.]+' | head -9 | tr '\n' ' ')
  say "$n | base $b | new $w"
done
