#!/usr/bin/env bash
# build_bins.sh BASE_REV NEW_REV DEST - the binaries dev/qpf27/run.sh times (base_bench_cuda,
# new_bench_cuda, new_test_cuda_{prefill_mma,quant_prefill,quant_attn}, xz-compressed) built in one
# build folder: BASE_REV's tree first, then the files NEW_REV changes (ninja rebuilds what depends on them).
# Release, sm_90a, optional dependencies off. Then: copy DEST into a carried folder next to run.sh.
set -eu
base=$1 new=$2 dest=$3
src=$(mktemp -d) bd=${KVA_BUILD:-build-qpf27}
git archive --prefix=s/ "$base" | tar -x -C "$src"
cmake -S "$src/s" -B "$bd" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF -DKVA_WITH_CJSON=OFF -DKVA_WITH_MPI=OFF -DKVA_WITH_NCCL=OFF >/dev/null
mkdir -p "$dest"
t="bench_cuda test_cuda_prefill_mma test_cuda_quant_prefill test_cuda_quant_attn"
ninja -C "$bd" $t
cp "$bd/bench_cuda" "$dest/base_bench_cuda"
# only the files that differ, with a fresh mtime (an archive's files carry the commit time)
for f in $(git diff --name-only "$base" "$new"); do
  mkdir -p "$(dirname "$src/s/$f")"; git show "$new:$f" >"$src/s/$f"
done
ninja -C "$bd" $t
for b in $t; do cp "$bd/$b" "$dest/new_$b"; done
xz -T2 "$dest"/*
