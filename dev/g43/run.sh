#!/usr/bin/env bash
# Session 43's closing GPU call on the merged tree, one GPU, tests only (each helper measured its
# own speed change base vs new in its own call; the merged tree's MLA and sparse MLA rows are timed last): build (optional libraries off: no .debs needed),
# the quick CUDA tests, compute-sanitizer memcheck of SAN="..." (quick), tests/python with the
# machine's torch on the CUDA build. Tree in ./new (git archive of main). Log: $OUT/g43.txt.
# run(command="bash .dev/g43/new/dev/g43/run.sh", carry=[".dev/g43"], kind="nvidia-h200")
set -uo pipefail
here=$(cd "$(dirname "$0")/../../.." && pwd); cd "$here"
res=${OUT:-$here/out}; out=/tmp/g43_logs; mkdir -p "$out" "$res"; LOG=$res/g43.txt
t0=$(date +%s); T() { echo "## $1: $(( $(date +%s) - t0 )) s" >>"$LOG"; }
echo "# gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); $(nproc) cores" >>"$LOG"
B=/tmp/g43b
cmake -S new -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF -DKVA_WITH_CJSON=OFF >$out/cmake.log 2>&1 || { tail -20 $out/cmake.log; exit 1; }
ninja -C $B -j$(nproc) >$out/build.log 2>&1 || { grep -m20 error $out/build.log; tail -5 $out/build.log; exit 1; }
T build
( timeout 200 $B/test_cuda_nan >$out/nan_full.log 2>&1
  echo "test_cuda_nan (full) rc=$?: $(grep -aE "passed|FAIL" $out/nan_full.log | tail -2 | tr "\n" " ")" >>"$LOG" ) &
( for x in test_cuda_mla test_cuda_mla_sparse test_cuda_mla_run test_cuda_reserve; do # whole, this session's kernels
    timeout 150 $B/$x >$out/full_$x.log 2>&1
    echo "$x (full) rc=$?: $(grep -aE "passed|FAIL" $out/full_$x.log | tail -2 | tr "\n" " " | cut -c1-200)" >>"$LOG"; done ) &
( for x in ${SAN:-test_cuda_mla_sparse test_cuda_mla test_cuda_reserve test_cuda_plan_update}; do
    KVA_TEST_QUICK=1 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 $B/$x >$out/san_$x.log 2>&1
    echo "memcheck $x quick: rc=$? $(grep -E 'ERROR SUMMARY' $out/san_$x.log | tail -1)" >>"$LOG"; done ) &
(cd new/tests/python && KVATTN_LIBRARY=$B/libkvattn.so PYTHONPATH=$here/new/python timeout 240 \
  python3 -m pytest -q -rs -p no:cacheprovider . >$out/pytest.log 2>&1); prc=$?
echo "pytest tests/python (CUDA build, torch $(python3 -c 'import torch; print(torch.__version__)' 2>&1)) rc=$prc: $(tail -1 $out/pytest.log)" >>"$LOG"
grep -E "^FAILED|^ERROR" $out/pytest.log | head -10 >>"$LOG"; T py
KVA_TEST_QUICK=1 ctest --test-dir $B -L cuda -j${CTJ:-3} --timeout 240 --output-on-failure >"$res/ctest.log" 2>&1
echo "ctest -L cuda (quick) rc=$?" >>"$LOG"
grep -E "tests passed|Failed|\*\*\*|Not Run" "$res/ctest.log" | tail -14 >>"$LOG"; T tests
wait; T san
# The merged tree's MLA rows (bench_cuda_mla, median of 30, checked) and sparse MLA rows
# (kvattn bench --mla-sparse, 20 iterations, checked), alone on the GPU.
for m in "H128 q2 8k B64|--batch 128 --context 8192 --heads 128 --q-len 2 --block-size 64" \
  "H128 q1 4k B64|--batch 128 --context 4096 --heads 128 --block-size 64" \
  "H128 q1 4k fp8|--batch 128 --context 4096 --heads 128 --kv-quant fp8" \
  "H16 q1 16k B64|--batch 128 --heads 16 --context 16384 --block-size 64" \
  "H16 q1 4k B64|--batch 128 --heads 16 --context 4096 --block-size 64" \
  "H16 q1 32k R64 B64|--batch 64 --heads 16 --context 32768 --block-size 64"; do
  j=$(timeout 60 $B/bench_cuda_mla ${m#*|} --iters 30 --check 1 2>&1 | tee -a $out/bench.err | grep -a '^bench_cuda_mla' | tail -1 | sed 's/^bench_cuda_mla: //')
  echo "mla ${m%%|*}: $j" >>"$LOG"
done
for m in "H16 R128|--heads 16 --batch 128" "H16 R16|--heads 16 --batch 16" "H8 R128|--heads 8 --batch 128" \
  "H64 R128 (H16 padded)|--heads 64 --batch 128" "H128 R128|--heads 128 --batch 128"; do
  x=$(timeout 30 $B/kvattn bench --mla-sparse --backend cuda --iters 20 --q-len 2 --topk 2048 --context 8192 ${m#*|} 2>&1 | grep -E ' ms ' | tail -1 | tr -s ' ')
  echo "sparse ${m%%|*}: $x" >>"$LOG"
done
# Issue 16's compute-friendly prefill (4k causal, H 128, D 192 / Dv 128 after decompression) through kva_mla_run
timeout 60 $B/kvattn bench --mla --backend cuda --mode prefill --q-len 4096 --heads 128 --iters 10 >$out/mla_prefill.log 2>&1
echo "mla prefill 4k H128 rc=$?:" >>"$LOG"; grep -aE "ms|TFLOP|check|phase" $out/mla_prefill.log | head -12 >>"$LOG"
T bench
tar -czf "$res/logs.tgz" -C "$out" .
cat "$LOG"
