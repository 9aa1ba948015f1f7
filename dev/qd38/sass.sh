#!/usr/bin/env bash
# dev/qd38/sass.sh TREE OUTDIR [FMT:D ...] - compile dev/qd38/one.cu against TREE's sources for
# sm_90a (one kernel per FMT:D, default 0:128 0:64 1:128) to OUTDIR/fFMT_dD.cubin, then
# dev/qd38/loop.py counts the key loop's SASS per opcode. CUOBJDUMP / NVDISASM: the tools.
set -euo pipefail
tree=$(cd "$1" && pwd); out=$2; shift 2; mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
for fd in "${@:-0:128 0:64 1:128}"; do
  for x in $fd; do
    f=${x%%:*}; d=${x#*:}
    nice -n 10 /usr/local/cuda/bin/nvcc -DKVA_CUDA_SM90A=1 -DKVA_HAVE_CUDA=1 -I"$tree/include" -I"$tree/src/core" \
      -I"$tree/src/plan" -I"$tree/src/attn/cuda" -O3 -DNDEBUG -std=c++17 -arch=sm_90a -cubin \
      -DQD_FMT=$f -DQD_D=$d -Xptxas -v "$here/one.cu" -o "$out/f${f}_d$d.cubin" 2>"$out/f${f}_d$d.ptxas.txt"
    grep -E "registers|spill" "$out/f${f}_d$d.ptxas.txt" | tr -s ' ' | head -3
  done
done
