#!/usr/bin/env bash
# link.sh: compiles tests/cuda/test_cuda_nan.c (into BUILD, default build-nan)
# and links it against LIB (default /work/main/build-lead/libkvattn.a, a
# Release sm_90a-real build of main) into OUTBIN (default BUILD/test_cuda_nan):
# the commands of `ninja -t commands test_cuda_mla_nan` in that build.
set -e
W=$(cd "$(dirname "$0")/../.." && pwd); B=${BUILD:-$W/build-nan}; mkdir -p "$B"; cd "$B"
nice /usr/bin/cc -DKVA_CUDA_SM90A=1 -DKVA_HAVE_CUDA=1 -I$W/src/core -I$W/tests -I$W/src/attn/cuda -I$W/include -isystem /usr/local/cuda/include -O3 -DNDEBUG -fPIE -Wall -Wextra -Wshadow -Wno-unused-parameter -fopenmp -std=c11 -o test_cuda_nan.c.o -c $W/tests/cuda/test_cuda_nan.c
/usr/bin/g++ -static-libgcc -static-libstdc++ test_cuda_nan.c.o -o ${OUTBIN:-test_cuda_nan} ${LIB:-/work/main/build-lead/libkvattn.a} /usr/local/cuda/lib/libcudart_static.a -ldl /usr/lib/x86_64-linux-gnu/librt.a /usr/lib/gcc/x86_64-linux-gnu/12/libgomp.so /usr/lib/x86_64-linux-gnu/libpthread.a -lm -lstdc++ -lcudadevrt -lcudart_static -lrt -lpthread -ldl -L/usr/local/cuda/targets/x86_64-linux/lib/stubs -L/usr/local/cuda/targets/x86_64-linux/lib
