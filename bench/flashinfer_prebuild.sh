#!/usr/bin/env bash
# flashinfer_prebuild.sh - compile FlashInfer's paged-prefill, paged-decode and MLA JIT modules on a
# machine WITHOUT a GPU (the dev VM: nvcc 13, PyPI), so the GPU machine runs the FlashInfer peer rows of
# bench/prefill_sdpa_peer.py, bench/decode_fi_peer.py and bench/peer_mla.py without spending its time on
# FlashInfer's JIT (~400 s there). Writes to OUTDIR:
#   fi-slim.tgz  the flashinfer package without its data/ (sources, headers);
#                the peer script generates nothing, so it needs none of them
#   fi-jit.tgz   <uri>/<uri>.so for every module built so far in OUTDIR (bf16 q / o, int32 indices, D 128,
#                no RoPE / window / soft-cap): KVA_FI_MODULES (default all six: "prefill decode decode-tc
#                decode-fp8 decode-tc-fp8 mla") picks which to build: prefill: the fa3 paged prefill of
#                bench/prefill_sdpa_peer.py short; decode / decode-fp8: BatchDecodeWithPagedKVCacheWrapper
#                on CUDA cores, bf16 / fp8 e4m3 cache; decode-tc(-fp8): its use_tensor_cores=True path
#                (the fa2 prefill module), for bench/decode_fi_peer.py; mla: BatchMLAPagedAttentionWrapper's
#                fa3 module (bf16 latent cache, c_kv 512, k_pe 64: what its backend "auto" plans first on
#                SM90), for bench/peer_mla.py
#   the apache-tvm-ffi wheel for the GPU machine's Python is not made here:
#   carry it beside (e.g. .whl/apache_tvm_ffi-*-cp312-*.whl).
# On the GPU machine: pip install --no-deps --target SITE <tvm-ffi wheel>;
# tar -xzf fi-slim.tgz -C SITE; tar -xzf fi-jit.tgz -C JIT;
# PYTHONPATH=SITE KVA_FI_PREBUILT=JIT python3 bench/prefill_sdpa_peer.py short (and bench/decode_fi_peer.py,
# bench/peer_mla.py); bench/decode_fi_peer.py --modules (no GPU) loads every one of them.
# Usage: bench/flashinfer_prebuild.sh FLASHINFER_WHEEL OUTDIR [VENV]
# (compiling took ~6 min with MAX_JOBS=2 on the 2-core dev VM on 2026-11-28, FlashInfer 0.7.2.post1, for the
# prefill module, ~6 min more for the four decode modules, 25 s for the mla module (MAX_JOBS=1); MAX_JOBS sets how
# many nvcc jobs run at once; built modules are not compiled again). dev/final/run.sh and dev/fi53/peer.sh take
# the outputs in their ./fi folder.
set -euo pipefail
whl=$(cd "$(dirname "$1")" && pwd)/$(basename "$1"); out=$(mkdir -p "$2" && cd "$2" && pwd)
venv=${3:-$out/venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q "$whl" torch
ws=$out/ws; mkdir -p "$ws"
FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_WORKSPACE_BASE=$ws MAX_JOBS=${MAX_JOBS:-1} \
  CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} KVA_FI_MODULES=${KVA_FI_MODULES:-prefill decode decode-tc decode-fp8 decode-tc-fp8 mla} \
  "$venv/bin/python" - <<'PY'
import os, torch
from flashinfer.jit.attention.modules import (gen_batch_prefill_module, gen_batch_decode_module,
                                              _gen_batch_prefill_primary_module, gen_batch_mla_module)
bf, e4, i32 = torch.bfloat16, torch.float8_e4m3fn, torch.int32
# The modules FlashInfer 0.7.2's wrappers load for bf16 q / o, int32 indices, D 128, no RoPE / window /
# soft-cap: the paged prefill on fa3 (prefill.py get_batch_prefill_module: gen_batch_prefill_module);
# BatchDecodeWithPagedKVCacheWrapper on CUDA cores (decode.py get_batch_decode_module:
# gen_batch_decode_module) and with use_tensor_cores=True on fa2 (its plan's backend for a bf16 cache;
# bench/decode_fi_peer.py pins it): get_batch_prefill_module("fa2") loads _gen_batch_prefill_primary_module
# (uri suffix _kv_stride_equal, enough while K and V have equal strides, as one paged tensor's halves do);
# BatchMLAPagedAttentionWrapper (mla/_batch_mla): backend "auto" tries fa3 first on an SM90a device
# (_auto_policy.py ordered_sm90_backends), whose plan loads get_batch_mla_module("fa3", q, kv, o, idx,
# ckv, kpe, use_profiler) (_fa_common.py): gen_batch_mla_module, uri suffix _sm90; bench/peer_mla.py's
# plan: bf16 q / kv / o, int32 indptr, c_kv 512, k_pe 64, no profiler.
specs = {"prefill": lambda: gen_batch_prefill_module("fa3", bf, bf, bf, i32, 128, 128, 0, False, False, False),
         "decode": lambda: gen_batch_decode_module(bf, bf, bf, i32, 128, 128, 0, False, False),
         "decode-tc": lambda: _gen_batch_prefill_primary_module("fa2", bf, bf, bf, i32, 128, 128, 0, False,
                                                                False, False),
         "decode-fp8": lambda: gen_batch_decode_module(bf, e4, bf, i32, 128, 128, 0, False, False),
         "decode-tc-fp8": lambda: _gen_batch_prefill_primary_module("fa2", bf, e4, bf, i32, 128, 128, 0, False,
                                                                    False, False),
         "mla": lambda: gen_batch_mla_module("fa3", bf, bf, bf, i32, 512, 64, False)}
for name in os.environ["KVA_FI_MODULES"].split():
    spec = specs[name]()
    spec.build()
    print("built", name, spec.get_library_path(), flush=True)
PY
site=$("$venv/bin/python" -c "import flashinfer, os; print(os.path.dirname(os.path.dirname(flashinfer.__file__)))")
tar --exclude='flashinfer/data' --exclude='__pycache__' -czf "$out/fi-slim.tgz" -C "$site" flashinfer \
  $(cd "$site" && ls -d flashinfer_python-*.dist-info)
(cd "$ws"/.cache/flashinfer/*/90a/cached_ops && tar -czf "$out/fi-jit.tgz" */*.so)
ls -la "$out"/fi-*.tgz
