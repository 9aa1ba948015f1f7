#!/usr/bin/env bash
# dev/mlaws29/sass_check.sh - compile the two MLA wgmma objects
# (mla_decode_wgmma.cu, mla_sparse_wgmma.cu) of two source trees for sm_90a
# with ptxas -v, and compare their SASS kernel by kernel (sass_cmp.py):
# the key-loop trait of mlaws29 must leave the 16-bit kernels (Lb0)
# identical to main's and the FP8 ones (Lb1) equal to mlaws28's v1 (dense,
# 18cc434) / v2 (sparse, a2bd4cc) up to static shared-memory offsets.
#   usage: bash dev/mlaws29/sass_check.sh A_TREE B_TREE OUTDIR
#   needs nvcc, cuobjdump and nvdisasm on PATH (CUDA 12.4+ / 13)
set -u
A=$1 B=$2 O=$3
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$O"
for t in A B; do
  T=${!t}
  for f in mla_decode_wgmma mla_sparse_wgmma; do
    echo "## $t=$T $f"
    nvcc -DKVA_CUDA_SM90A=1 -DKVA_HAVE_CUDA=1 -DKVA_VERSION_STRING=\"0.1.0\" -I"$T/include" \
      -I"$T/src/core" -I"$T/src/plan" -O3 -DNDEBUG \
      --generate-code=arch=compute_90a,code=[compute_90a,sm_90a] -Xcompiler=-fPIC \
      -std=c++17 -Xptxas -v -x cu -c "$T/src/attn/cuda/$f.cu" -o "$O/${t}_$f.o" 2>&1 |
      grep -E "Compiling entry|spill|Used|error" | sed 's/ptxas info    : //'
    cuobjdump -sass "$O/${t}_$f.o" >"$O/${t}_$f.sass"
  done
done
for f in mla_decode_wgmma mla_sparse_wgmma; do
  echo "## SASS $f: A vs B"
  python3 "$here/sass_cmp.py" "$O/A_$f.sass" "$O/B_$f.sass"
done
