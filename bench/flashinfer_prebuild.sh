#!/usr/bin/env bash
# flashinfer_prebuild.sh - compile FlashInfer's paged-prefill JIT module on a
# machine WITHOUT a GPU (the dev VM: nvcc 13, PyPI), so the GPU machine runs
# the FlashInfer peer rows of bench/prefill_sdpa_peer.py without spending its
# time on FlashInfer's JIT (~400 s there). Writes to OUTDIR:
#   fi-slim.tgz  the flashinfer package without its data/ (sources, headers);
#                the peer script generates nothing, so it needs none of them
#   fi-jit.tgz   <uri>/<uri>.so for the module the peer rows load (fa3 backend,
#                bf16 q/kv/o, int32 indices, D 128, no RoPE / window / soft-cap)
#   the apache-tvm-ffi wheel for the GPU machine's Python is not made here:
#   carry it beside (e.g. .whl/apache_tvm_ffi-*-cp312-*.whl).
# On the GPU machine: pip install --no-deps --target SITE <tvm-ffi wheel>;
# tar -xzf fi-slim.tgz -C SITE; tar -xzf fi-jit.tgz -C JIT;
# PYTHONPATH=SITE KVA_FI_PREBUILT=JIT python3 bench/prefill_sdpa_peer.py short
# Usage: bench/flashinfer_prebuild.sh FLASHINFER_WHEEL OUTDIR [VENV]
# (compiling took ~6 min with MAX_JOBS=2 on the 2-core dev VM on 2026-11-28, FlashInfer 0.7.2.post1;
# MAX_JOBS sets how many nvcc jobs run at once). dev/final/run.sh takes the outputs in its ./fi folder.
set -euo pipefail
whl=$(cd "$(dirname "$1")" && pwd)/$(basename "$1"); out=$(mkdir -p "$2" && cd "$2" && pwd)
venv=${3:-$out/venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q "$whl" torch
ws=$out/ws; mkdir -p "$ws"
FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_WORKSPACE_BASE=$ws MAX_JOBS=${MAX_JOBS:-1} \
  CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} "$venv/bin/python" - <<'PY'
import torch
from flashinfer.jit.attention.modules import gen_batch_prefill_module
spec = gen_batch_prefill_module("fa3", torch.bfloat16, torch.bfloat16, torch.bfloat16,
                                torch.int32, 128, 128, 0, False, False, False)
spec.build()
print("built", spec.get_library_path())
PY
site=$("$venv/bin/python" -c "import flashinfer, os; print(os.path.dirname(os.path.dirname(flashinfer.__file__)))")
tar --exclude='flashinfer/data' --exclude='__pycache__' -czf "$out/fi-slim.tgz" -C "$site" flashinfer \
  $(cd "$site" && ls -d flashinfer_python-*.dist-info)
(cd "$ws"/.cache/flashinfer/*/90a/cached_ops && tar -czf "$out/fi-jit.tgz" */*.so)
ls -la "$out"/fi-*.tgz
