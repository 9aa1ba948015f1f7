#!/bin/bash
# dev/review63/emul/run_emul.sh [test.c] - builds tests/cuda/test_cuda_mla_gemm.c
# (or the given copy) against the host GEMM of gemm_emul.c and the fake CUDA
# runtime, links the CPU library for the dtype / status helpers, and runs it
# clean and under each planted fault (each must fail). Needs a CPU build of
# the tree: LIB (default /work/main/build-cpu/libkvattn.a).
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
test_c=${1:-$root/tests/cuda/test_cuda_mla_gemm.c}
LIB=${LIB:-/work/main/build-cpu/libkvattn.a}
out=${OUT_DIR:-/tmp/review63_emul}
mkdir -p "$out"
inc="-I$here -I$root/src/core -I$root/tests -I$root/include -I$root/src/attn/cuda"
cc -O1 -std=c11 -Wall -Wextra -Wno-unused-parameter -DKVA_HAVE_CUDA \
   -Dkva_backend_available=emu_backend_available $inc \
   "$test_c" "$here/gemm_emul.c" "$LIB" -fopenmp -lm -lpthread -ldl -o "$out/t" || exit 1
r=0
echo "== clean"; "$out/t" > "$out/clean.txt" 2>&1; rc=$?; tail -1 "$out/clean.txt"
[ $rc -eq 0 ] || { echo "clean run failed"; r=1; }
for f in 1 2 3 4; do
  REVIEW63_FAULT=$f "$out/t" > "$out/fault$f.txt" 2>&1; rc=$?
  echo "== fault $f: rc $rc ($(tail -1 "$out/fault$f.txt")); $(grep -c 'CHECK failed' "$out/fault$f.txt") failed checks"
  [ $rc -ne 0 ] || r=1
done
exit $r
