#!/bin/bash
# Builds test_cuda_nan and test_cuda_hidden for their CPU stand-in modes
# (KVA_TEST_NAN_CPU=1 / KVA_TEST_HIDDEN_CPU=1) on a machine without a GPU:
# the test compiled with KVA_HAVE_CUDA, linked against the CPU build's static
# library, the CUDA backend's few referenced symbols stubbed (never called in
# that mode), cudart static. Usage: dev/g53/standin.sh BUILD_CPU OUTDIR
set -euo pipefail
B=${1:-build-cpu}; O=${2:-/tmp/g53_sb}
mkdir -p "$O"
for f in test_cuda_nan test_cuda_hidden; do
  gcc -O2 -std=c11 -fopenmp -DKVA_HAVE_CUDA=1 -Isrc/core -Itests -Isrc/attn/cuda -Iinclude \
      -isystem /usr/local/cuda/include tests/cuda/$f.c dev/g53/standin_stubs.c "$B/libkvattn.a" \
      /usr/local/cuda/lib64/libcudart_static.a -lm -lpthread -ldl -lrt -o "$O/$f"
done
