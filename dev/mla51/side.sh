#!/usr/bin/env bash
# dev/mla51/side.sh (a copy of dev/mla50/side.sh) NAME SRCROOT [BUILD]: builds one side of the MLA wgmma
# A/B on the dev VM without a full CUDA build. Compiles only the two objects
# the wgmma MLA body reaches (mla_decode_wgmma.cu, mla_sparse_wgmma.cu) from
# SRCROOT's sources (-lineinfo added for Nsight Compute's source page), puts
# them into a copy of a full CUDA build's libkvattn.a (BUILD/lib_common.a,
# copied once from a Release sm_90a build of main), and links the MLA bench
# and tests against it: BUILD/side_NAME/bin/. BUILD (default build-cu) must be
# configured as dev/g41/stage.sh configures its build (static libgcc/libstdc++).
# KVA_SIDE_FLAGS: extra nvcc flags for the two objects (-D switches).
set -euo pipefail
name=$1 src=$(cd "$2" && pwd) b=${3:-build-cu}
cd "$(dirname "$0")/../.."
root=$(pwd)
cd "$b"
[ -f lib_common.a ] || { echo "missing $b/lib_common.a"; exit 1; }
o=side_$name
mkdir -p "$o/bin"
pids=""
for f in mla_decode_wgmma mla_sparse_wgmma; do
  cmd=$(ninja -t commands "CMakeFiles/kvattn_obj.dir/src/attn/cuda/$f.cu.o" | tail -1)
  cmd=${cmd//"-I$root/"/"-I$src/"}
  cmd=${cmd//"$root/src/attn/cuda/$f.cu"/"$src/src/attn/cuda/$f.cu"}
  cmd=${cmd//"-o CMakeFiles/kvattn_obj.dir/src/attn/cuda/$f.cu.o"/"-o $o/$f.cu.o"}
  cmd=${cmd//"-MF CMakeFiles/kvattn_obj.dir/src/attn/cuda/$f.cu.o.d"/"-MF $o/$f.cu.o.d"}
  (eval "nice -n 10 $cmd -lineinfo -Xptxas -v ${KVA_SIDE_FLAGS:-}" >"$o/ptxas_$f.log" 2>&1 || { echo "nvcc $f failed"; tail "$o/ptxas_$f.log"; exit 1; }) &
  pids="$pids $!"
done
T="bench_cuda_mla test_cuda_mla test_cuda_mla_run test_cuda_mla_sparse test_cuda_mla_nan"
objs=""
for t in $T; do
  f=$(ninja -t commands $t | tail -1 | grep -oE "CMakeFiles/$t.dir/[^ ]+\.o" | head -1)
  objs="$objs $f"
done
nice ninja $objs >/dev/null
for p in $pids; do wait $p; done
cp lib_common.a "$o/libkvattn.a"
(cd "$o" && ar r libkvattn.a mla_decode_wgmma.cu.o mla_sparse_wgmma.cu.o)
for t in $T; do
  cmd=$(ninja -t commands $t | tail -1)
  cmd=${cmd//" libkvattn.a "/" $o/libkvattn.a "}
  cmd=${cmd//"-o $t "/"-o $o/bin/$t "}
  eval "$cmd"
done
ls -la "$o/bin"
