#!/usr/bin/env bash
# dev/x4/ct.sh TREE - the CUDA tests of one tree on one GPU (dev/x4/multi.sh's "ct" experiment):
# a Release CUDA build (90a) of TREE with its tests, `ctest -L cuda` with the quick sets, then the
# Python tests (tests/python, the machine's own torch / numpy / pytest) against the built
# libkvattn.so (KVATTN_LIBRARY), so the torch paths meet a CUDA build. Logs in $OUT.
set -uo pipefail
t=$(cd "$1" && pwd); o=${OUT:-/tmp/ct_out}; mkdir -p "$o"; s=$(date +%s)
el() { echo "[$(( $(date +%s) - s )) s] $*" | tee -a "$o/summary.txt"; }
root=$(cd "$(dirname "$0")/../.." && pwd)
export KVA_DEBS=${KVA_DEBS:-$root/.debs}; . "$root/scripts/device_deps.sh"
cd "$t"
cmake -S . -B bd -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  ${KVA_DEP_ARGS[@]+"${KVA_DEP_ARGS[@]}"} -DKVA_WITH_MPI=OFF -DKVA_WITH_NCCL=OFF >"$o/cfg.log" 2>&1 || { el "configure failed"; tail "$o/cfg.log"; exit 1; }
ninja -C bd -j"$(nproc)" >"$o/build.log" 2>&1 || { el "build failed"; grep -E "error" "$o/build.log" | head; exit 1; }
el "built"
KVA_TEST_QUICK=1 ctest --test-dir bd -L cuda -j3 --timeout 240 --output-on-failure >"$o/ctest.log" 2>&1
el "ctest -L cuda (quick) rc=$?: $(grep -E 'tests passed' "$o/ctest.log")"
grep -E "\*\*\*|Failed|Not Run" "$o/ctest.log" | head -20 | tee -a "$o/summary.txt"
lib=$(ls bd/libkvattn.so* 2>/dev/null | head -1)
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.is_available())" 2>&1 | tee -a "$o/summary.txt"
(cd tests/python && KVATTN_LIBRARY="$t/$lib" PYTHONPATH="$t/python" timeout 240 python3 -m pytest -q \
  -p no:cacheprovider . >"$o/pytest.log" 2>&1)
el "pytest rc=$?: $(tail -1 "$o/pytest.log")"
grep -E "FAILED|Error" "$o/pytest.log" | head -20 | tee -a "$o/summary.txt"
