#!/usr/bin/env bash
# py50's H200 call (session 42): the whole tests/python on a CUDA build of
# main's C sources (dev/g41/stage.sh's libkvattn.so, sm_90a, OpenSSL / xxHash /
# cJSON off; staged as .dev/py50/lib.xz) over this branch's python/ and
# tests/python, then dev/py50/mem.py (graph-mode wrapper memory at SGLang
# sizes). Run: run(command="bash .dev/py50/new/dev/py50/call.sh",
# carry=[".dev/py50"], kind="nvidia-h200").
here=$(cd "$(dirname "$0")" && pwd)
stage=$(cd "$here/../../.." && pwd)
new=$stage/new
out=${OUT:-/tmp/out}; mkdir -p "$out"; L=$out/py50.log
t0=$(date +%s); T() { echo "[$(( $(date +%s) - t0 )) s] $*" >>"$L"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$L" 2>&1
xz -dc "$stage/lib.xz" >"$stage/libkvattn.so" && T "lib unpacked"
export KVATTN_LIBRARY=$stage/libkvattn.so PYTHONPATH=$new/python
python3 -c "import torch, numpy, pytest; print('torch', torch.__version__, 'numpy', numpy.__version__, 'pytest', pytest.__version__)" >>"$L" 2>&1
( cd "$new/tests/python" && timeout ${PT:-180} python3 -m pytest -q -p no:cacheprovider -rs --durations=12 . >"$out/pytest.log" 2>&1
  echo "rc=$?" >>"$out/pytest.log" )
T "pytest: $(grep -E 'passed|failed' "$out/pytest.log" | tail -1) $(tail -1 "$out/pytest.log")"
grep -E "^(FAILED|ERROR)" "$out/pytest.log" | cut -c1-200 >>"$L"
grep -E "^SKIPPED" "$out/pytest.log" | cut -c1-200 >>"$L"
( cd "$new" && timeout ${MT:-90} python3 dev/py50/mem.py >"$out/mem.log" 2>&1; echo "rc=$?" >>"$out/mem.log" )
T "mem.py done"
cat "$out/mem.log" >>"$L"
cat "$L"
