#!/bin/bash
# gpu_check.sh [BUILD [ARCH]]: nan42's check of the CUDA MLA NaN rule on a GPU machine, run from
# the repository root (BUILD default build-nan42, ARCH default 90a):
#   1. builds test_cuda_mla_nan and the other MLA CUDA tests (Release) and runs test_cuda_mla_nan
#      quick, then full: every case must pass;
#   2. the probe test_hidden_nan_value (KVA_TEST_NAN_HIDDEN=1): prints whether a NaN value of a key
#      the causal mask hides reaches the rows of the same tile (informational; it fails if so);
#   3. the planted fault: the same test linked against a copy of libkvattn.a whose mla_run.cu and
#      mla_sparse.cu merges are main's (dev/nan42/old_merges.patch applied to copies of the two
#      files): it must FAIL (test_layer_prefill: the rows with a -inf round; test_sparse: lse -inf
#      where NaN is due), and test_layer_decode / test_kernel_decode must pass there too;
#   4. ctest -R test_cuda_mla (KVA_TEST_QUICK=1): the existing MLA CUDA tests with the fixes.
# Without BUILD's -j, ninja uses every core. Exit status: 0 when 1, 3 and 4 came out as stated.
set -u
root=$(pwd)
b=${1:-build-nan42}
arch=${2:-90a}
mkdir -p "$b"
cmake -S . -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" > "$b/nan42_configure.log" 2>&1 ||
    { tail -20 "$b/nan42_configure.log"; exit 1; }
ninja -C "$b" test_cuda_mla_nan test_cuda_mla test_cuda_mla_run test_cuda_mla_sparse 2>&1 | tail -3
cd "$b" || exit 1
rc=0
echo "== 1. test_cuda_mla_nan (quick, then full)"
KVA_TEST_QUICK=1 KVA_TEST_TIMES=1 ./test_cuda_mla_nan || rc=1
./test_cuda_mla_nan > nan42_full.log 2>&1 || rc=1
grep -E "passed|FAILED|CHECK" nan42_full.log | head -20
echo "== 2. probe: a NaN value hidden by the causal mask"
KVA_TEST_NAN_HIDDEN=1 KVA_TEST_ONLY=test_hidden_nan_value ./test_cuda_mla_nan 2>&1 | tail -12
echo "== 3. planted fault: main's merges (must fail)"
old=nan42_old
rm -rf "$old" && mkdir -p "$old/src/attn/cuda"
cp "$root/src/attn/cuda/mla_run.cu" "$root/src/attn/cuda/mla_sparse.cu" "$old/src/attn/cuda/"
(cd "$old" && { patch -s -p1 < "$root/dev/nan42/old_merges.patch" 2>/dev/null ||
    git apply -p1 "$root/dev/nan42/old_merges.patch"; }) || { echo "patch failed"; exit 1; }
pids=()
for f in mla_run mla_sparse; do # the build's own nvcc command, on the copies (in parallel)
    cmd=$(ninja -t commands "CMakeFiles/kvattn_obj.dir/src/attn/cuda/$f.cu.o" | tail -1)
    cmd=${cmd//"$root/src/attn/cuda/$f.cu"/"$root/$b/$old/src/attn/cuda/$f.cu -I$root/src/attn/cuda"}
    cmd=${cmd//"CMakeFiles/kvattn_obj.dir/src/attn/cuda/"/"$old/"}
    (eval "$cmd") &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || { echo "compile of an old merge file failed"; exit 1; }; done
cp libkvattn.a "$old/libkvattn.a"
(cd "$old" && ar r libkvattn.a mla_run.cu.o mla_sparse.cu.o)
link=$(ninja -t commands test_cuda_mla_nan | tail -1)
link=${link//" libkvattn.a "/" $old/libkvattn.a "}
link=${link//"-o test_cuda_mla_nan "/"-o $old/test_cuda_mla_nan_old "}
(eval "$link") || { echo "link failed"; exit 1; }
KVA_TEST_QUICK=1 "./$old/test_cuda_mla_nan_old" > nan42_old.log 2>&1
old_rc=$?
grep -E "rows \(|passed|FAILED" nan42_old.log | grep -E "[1-9][0-9]* wrong|passed|FAILED" | head -20
if [ $old_rc -eq 0 ] || ! grep -q "FAILED: test_layer_prefill" nan42_old.log ||
    ! grep -q "FAILED: test_sparse" nan42_old.log || grep -q "FAILED: test_layer_decode" nan42_old.log ||
    grep -q "FAILED: test_kernel_decode" nan42_old.log; then
    echo "the planted fault did not fail as expected"
    rc=1
fi
echo "== 4. ctest -R test_cuda_mla (quick)"
KVA_TEST_QUICK=1 ctest -R test_cuda_mla --output-on-failure > nan42_ctest.log 2>&1 || rc=1
tail -8 nan42_ctest.log
echo "gpu_check rc $rc"
exit $rc
