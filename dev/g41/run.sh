#!/usr/bin/env bash
# Session 41's one GPU call: prebuilt (dev VM, sm_90a-real, Release) CUDA test
# binaries and libkvattn.so (dev/g41/stage.sh), and tests/python's graph-mode test
# on the machine's torch. test_cuda_mla_nan_old is the same test linked against
# main's old MLA merges (dev/nan42/old_merges.patch): it must FAIL.
here=$(cd "$(dirname "$0")" && pwd); out=${OUT:-/tmp/out}; mkdir -p "$out"; L=$out/g41.log
t0=$(date +%s); T() { echo "[$(( $(date +%s) - t0 )) s] $*" >>"$L"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >>"$L" 2>&1
( . /etc/os-release; echo "os: $PRETTY_NAME"; ldd --version | head -1 ) >>"$L" 2>&1
cd "$here" && tar -xJf bins.tar.xz && T "unpacked"
export KVA_TEST_QUICK=1
run() { local t=$1; [ -x bin/$t ] || { echo "$t: missing" >>"$L"; return; }
  timeout ${TT:-30} bin/$t >$out/$t.log 2>&1; local rc=$?
  T "$t rc=$rc: $(grep -E -i 'passed|failed|error' $out/$t.log | tail -3 | tr '\n' ' ' | cut -c1-300)"
  [ $rc = 127 ] && ldd bin/$t >>"$L" 2>&1; }
run test_cuda_graph
run test_cuda_cascade
run test_cuda_mla_nan
run test_cuda_mla_nan_old
run test_cuda_nan
( cd "$here/py/tests/python" && KVATTN_LIBRARY=$here/bin/libkvattn.so PYTHONPATH=$here/py/python \
  timeout ${PT:-120} python3 -m pytest -q -p no:cacheprovider ${PYTESTS:-test_fi_graph.py test_fi_modules.py} >$out/pytest.log 2>&1
  echo "rc=$?" >>$out/pytest.log )
T "pytest ${PYTESTS:-test_fi_graph.py test_fi_modules.py}: $(tail -2 $out/pytest.log | tr '\n' ' ')"
grep -E "^(E  |FAILED)" $out/pytest.log | head -6 >>"$L"
run test_cuda_plan_update
run test_cuda_mla
run test_cuda_mla_run
run test_cuda_mla_sparse
run test_cuda_prefill_mma
run test_cuda_hidden
cat "$L"
