#!/usr/bin/env bash
# peer_cpu.sh - kvattn vs PyTorch's CPU scaled_dot_product_attention on the
# same shapes (bench/peer_cpu_sdpa.py), rerunnable by anyone:
#   scripts/peer_cpu.sh [--threads N] [--dtypes bf16,f16,f32] [--shapes prefill:4096 decode:16:4096 ...]
# Creates a venv (KVA_PEER_VENV, default build/peer-venv) and installs torch's
# CPU wheel from download.pytorch.org/whl/cpu; when that index cannot be
# reached it installs `torch` from PyPI instead (the default wheel, which also
# pulls the CUDA libraries; only its CPU kernels are used) and says so.
# Builds build/kvattn (Release) if it is missing. Extra arguments go to the
# Python script.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${KVA_PEER_VENV:-build/peer-venv}
PY=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
    if "$VENV/bin/pip" install --quiet torch --index-url https://download.pytorch.org/whl/cpu; then
        echo "peer_cpu: installed torch from the CPU wheel index (download.pytorch.org/whl/cpu)"
    else
        echo "peer_cpu: the CPU wheel index is unreachable; installing torch from PyPI instead" >&2
        "$VENV/bin/pip" install --quiet torch
    fi
fi

if [ ! -x build/kvattn ]; then
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=OFF
    ninja -C build kvattn_cli
fi

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores"
exec "$VENV/bin/python" bench/peer_cpu_sdpa.py --kvattn build/kvattn "$@"
