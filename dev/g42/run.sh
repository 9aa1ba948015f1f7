#!/usr/bin/env bash
# Session 42's closing GPU call on the merged tree, one GPU, tests only (each helper measured its
# own speed change base vs new in its own call): build (optional libraries off: no .debs needed),
# the quick CUDA tests, compute-sanitizer memcheck of SAN="..." (quick), tests/python with the
# machine's torch on the CUDA build. Tree in ./new (git archive of main). Log: $OUT/g42.txt.
# run(command="bash .dev/g42/new/dev/g42/run.sh", carry=[".dev/g42"], kind="nvidia-h200")
set -uo pipefail
here=$(cd "$(dirname "$0")/../../.." && pwd); cd "$here"
res=${OUT:-$here/out}; out=/tmp/g42_logs; mkdir -p "$out" "$res"; LOG=$res/g42.txt
t0=$(date +%s); T() { echo "## $1: $(( $(date +%s) - t0 )) s" >>"$LOG"; }
echo "# gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); $(nproc) cores" >>"$LOG"
B=/tmp/g42b
cmake -S new -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF -DKVA_WITH_CJSON=OFF >$out/cmake.log 2>&1 || { tail -20 $out/cmake.log; exit 1; }
ninja -C $B -j$(nproc) >$out/build.log 2>&1 || { grep -m20 error $out/build.log; tail -5 $out/build.log; exit 1; }
T build
( for x in ${SAN:-test_cuda_mla_sparse test_cuda_nan test_cuda_mla_nan}; do
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
tar -czf "$res/logs.tgz" -C "$out" .
cat "$LOG"
