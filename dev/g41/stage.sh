#!/usr/bin/env bash
# stage.sh [BUILD]: builds on the dev VM (no GPU needed) what dev/g41/run.sh
# runs on a GPU machine in one short call, and stages it in .dev/g41 (git-
# ignored; carry [".dev/g41"]): libkvattn.so and the CUDA tests of the work no
# GPU has run yet (the side-stream capture of test_cuda_graph, test_cuda_mla_nan
# and the same test linked against the old MLA merges, which must fail, the
# MLA / plan-update tests nan41 changed), xz-compressed (~23 MB), plus
# python/ and tests/python for test_fi_graph.py on the machine's torch.
# Build: Release, sm_90a machine code, optional libraries off, libgcc /
# libstdc++ linked statically where the link allows (the binaries need glibc
# >= 2.35 on the machine). Takes ~6 min on the 2-core VM when it is quiet.
# Then: run(command="bash .dev/g41/run.sh", carry=[".dev/g41"]).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd) b=${1:-build-g41} old=nan42_old
cmake -S . -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a-real -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF \
  -DKVA_WITH_CJSON=OFF -DKVA_WITH_MPI=OFF -DKVA_WITH_NCCL=OFF \
  -DCMAKE_EXE_LINKER_FLAGS="-static-libgcc -static-libstdc++" \
  -DCMAKE_SHARED_LINKER_FLAGS="-static-libgcc -static-libstdc++" >/dev/null
tests="test_cuda_graph test_cuda_cascade test_cuda_plan_update test_cuda_mla_nan test_cuda_nan test_cuda_mla test_cuda_mla_run test_cuda_mla_sparse test_cuda_prefill_mma test_cuda_hidden"
nice ninja -C "$b" -j2 libkvattn.so $tests
# test_cuda_mla_nan against main's old merges (dev/nan42/old_merges.patch): the planted fault
( cd "$b" && rm -rf "$old" && mkdir -p "$old/src/attn/cuda" &&
  cp "$root/src/attn/cuda/mla_run.cu" "$root/src/attn/cuda/mla_sparse.cu" "$old/src/attn/cuda/" &&
  (cd "$old" && patch -s -p1 <"$root/dev/nan42/old_merges.patch") &&
  for f in mla_run mla_sparse; do
    cmd=$(ninja -t commands "CMakeFiles/kvattn_obj.dir/src/attn/cuda/$f.cu.o" | tail -1)
    cmd=${cmd//"$root/src/attn/cuda/$f.cu"/"$root/$b/$old/src/attn/cuda/$f.cu -I$root/src/attn/cuda"}
    cmd=${cmd//"CMakeFiles/kvattn_obj.dir/src/attn/cuda/"/"$old/"}
    eval "nice $cmd"
  done &&
  cp libkvattn.a "$old/libkvattn.a" && (cd "$old" && ar r libkvattn.a mla_run.cu.o mla_sparse.cu.o) &&
  link=$(ninja -t commands test_cuda_mla_nan | tail -1) &&
  link=${link//" libkvattn.a "/" $old/libkvattn.a "} &&
  link=${link//"-o test_cuda_mla_nan "/"-o $old/test_cuda_mla_nan_old "} && eval "$link" )
s=.dev/g41
rm -rf "$s" && mkdir -p "$s/bin" "$s/py/tests"
cp -L "$b/libkvattn.so" "$s/bin/libkvattn.so"
for t in $tests; do cp "$b/$t" "$s/bin/"; done
cp "$b/$old/test_cuda_mla_nan_old" "$s/bin/"
cp -r python "$s/py/" && cp -r tests/python "$s/py/tests/"
find "$s/py" -name __pycache__ -prune -exec rm -rf {} +
(cd "$s" && tar -cf - bin | xz -T2 -6 >bins.tar.xz && rm -rf bin)
cp dev/g41/run.sh "$s/run.sh"
ls -la "$s"
