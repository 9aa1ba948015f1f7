#!/usr/bin/env bash
# dev/mla50/sass_cmp.sh BASE_ROOT NEW_ROOT OBJ... : compiles each CUDA object
# OBJ (src/attn/cuda/OBJ.cu) from two source trees with this worktree's
# build-cu commands and says whether their SASS (cuobjdump -sass, addresses
# dropped) is identical. CUOBJDUMP: a cuobjdump (the VM has none in its CUDA
# bin; triton's copy in /work/venv-api41 reads sm_90a).
set -u
a=$(cd "$1" && pwd) n=$(cd "$2" && pwd)
shift 2
cd "$(dirname "$0")/../.."
root=$(pwd) b=$(pwd)/build-cu
CU=${CUOBJDUMP:-/work/venv-api41/lib/python3.11/site-packages/triton/backends/nvidia/bin/cuobjdump}
mkdir -p "$b/cmp"
for f in "$@"; do
  for side in base new; do
    src=$a; [ $side = new ] && src=$n
    cmd=$(cd "$b" && ninja -t commands "CMakeFiles/kvattn_obj.dir/src/attn/cuda/$f.cu.o" | tail -1)
    cmd=${cmd//"-I$root/"/"-I$src/"}
    cmd=${cmd//"$root/src/attn/cuda/$f.cu"/"$src/src/attn/cuda/$f.cu"}
    cmd=${cmd//"-o CMakeFiles/kvattn_obj.dir/src/attn/cuda/$f.cu.o"/"-o cmp/${f}_$side.o"}
    cmd=${cmd//"-MF CMakeFiles/kvattn_obj.dir/src/attn/cuda/$f.cu.o.d"/"-MF cmp/${f}_$side.o.d"}
    (cd "$b" && eval "nice -n 10 $cmd") || echo "nvcc $f $side failed"
    "$CU" -sass "$b/cmp/${f}_$side.o" | grep -E "^\s+/\*[0-9a-f]{4}\*/" |
      sed 's#/\*[0-9a-f]*\*/##g' | md5sum >"$b/cmp/${f}_$side.md5"
  done
  echo "$f: $(cmp -s "$b/cmp/${f}_base.md5" "$b/cmp/${f}_new.md5" && echo SASS identical || echo SASS DIFFERS)"
done
