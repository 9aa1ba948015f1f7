#!/usr/bin/env bash
# Session 43's follow-up GPU call: test_cuda_hidden crashed (SegFault, quick) in the closing call
# (dev/g43/run.sh); this builds the library, test_cuda_hidden (host C code with -g) and the Python
# package's library, runs test_cuda_hidden quick then whole with line-buffered output (gdb's
# backtrace on a crash when gdb is there), then tests/python on the CUDA build (api54's context
# lock). Tree in ./new (git archive of main). Log: $OUT/h.txt.
# run(command="bash .dev/g43h/new/dev/g43/hidden.sh", carry=[".dev/g43h"], kind="nvidia-h200")
set -uo pipefail
here=$(cd "$(dirname "$0")/../../.." && pwd); cd "$here"
res=${OUT:-$here/out}; out=/tmp/g43h_logs; mkdir -p "$out" "$res"; LOG=$res/h.txt
t0=$(date +%s); T() { echo "## $1: $(( $(date +%s) - t0 )) s" >>"$LOG"; }
echo "# gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); $(nproc) cores" >>"$LOG"
B=/tmp/g43h
cmake -S new -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DCMAKE_C_FLAGS=-g -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF -DKVA_WITH_CJSON=OFF >$out/cmake.log 2>&1 ||
  { tail -20 $out/cmake.log; exit 1; }
ninja -C $B -j$(nproc) libkvattn.so test_cuda_hidden >$out/build.log 2>&1 ||
  { grep -m20 error $out/build.log; tail -5 $out/build.log; exit 1; }
T build
for mode in quick whole; do
  q=""; [ $mode = quick ] && q="KVA_TEST_QUICK=1"
  env $q timeout 150 stdbuf -oL -eL $B/test_cuda_hidden >$out/hidden_$mode.log 2>&1; rc=$?
  echo "test_cuda_hidden ($mode) rc=$rc: $(grep -aE "passed|FAIL|CHECK" $out/hidden_$mode.log | tail -3 | tr '\n' ' ' | cut -c1-300)" >>"$LOG"
  if [ $rc -ge 128 ]; then
    tail -8 $out/hidden_$mode.log >>"$LOG"
    command -v gdb >/dev/null && env $q timeout 120 gdb -batch -ex run -ex bt $B/test_cuda_hidden \
      >$out/gdb_$mode.log 2>&1 && grep -aE "^#|SIG" $out/gdb_$mode.log | head -20 >>"$LOG"
    break
  fi
  T $mode
done
(cd new/tests/python && KVATTN_LIBRARY=$B/libkvattn.so PYTHONPATH=$here/new/python timeout 200 \
  python3 -m pytest -q -rs -p no:cacheprovider . >$out/pytest.log 2>&1); prc=$?
echo "pytest tests/python (CUDA build) rc=$prc: $(tail -1 $out/pytest.log)" >>"$LOG"
grep -E "^FAILED|^ERROR" $out/pytest.log | head -10 >>"$LOG"; T py
tar -czf "$res/logs.tgz" -C "$out" .
cat "$LOG"
