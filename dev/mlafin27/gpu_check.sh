#!/usr/bin/env bash
# dev/mlafin27/gpu_check.sh BASE NEW - one-call GPU check of branch mlafin27 (issue 15: the
# MLA epilogue is one ml_finish for the dense and sparse kernels, destinations from a policy;
# the tensor-core tile max is one kva__dmma_row_max), BASE and NEW being two source trees
# (`git archive` of main and of the branch, or of main merged with it):
#   build  BASE (sm_90a, Release, no optional deps; test_cuda_mla, test_cuda_mla_sparse,
#          test_cuda_mla_run, test_cuda_attn), keeps the binaries and the objects of the
#          changed kernels, copies NEW's differing files over the same build tree and rebuilds
#          (only what changed recompiles; NEW must add or remove no source file);
#   test   the four tests of NEW, then of BASE, with KVA_TEST_QUICK=1: one line per test;
#   res    per kernel of the MLA and tensor-core decode objects, base vs new: registers,
#          stack, shared memory, spills, SASS instruction counts (scripts/sass_stats.py,
#          res_table.py), PTX lines changed before / inside / after the key loop
#          (ptx_cmp.py) and the SASS key loop (sass_loop.py); the VM's numbers for the same
#          objects are in bench/results/vm_2026-11-27_mlafin27.txt (nvcc 13.0 there: a
#          different nvcc on the device gives other absolute counts);
#   sanitize (not by default) compute-sanitizer memcheck of NEW's test_cuda_mla_sparse and
#          test_cuda_mla (quick).
# OUT: log folder (default ./gpu_check_out). KVA_GC_STEPS: default "build test res";
# KVA_GC_BASE_TESTS=0: the tests on NEW only.
# Expected on 16 cores (estimate, not measured): base build ~100 s, new ~50 s (about ten
# objects), tests a few seconds to tens of seconds each, res ~30 s. Pass: the four tests
# rc=0 on new (and as on base), the res table's dense and decode rows with equal registers,
# stack and spills. KVA_GC_STEPS="build test" skips res if time is short.
# Stage on the VM (NEW = main merged with mlafin27, so main's newer files are kept):
#   d=/work/main/.dev/mlafin27; rm -rf $d && mkdir -p $d
#   git -C /work/main archive --prefix=base/ main | tar -x -C $d
#   T=$(git -C /work/main merge-tree --write-tree main mlafin27 | head -1)
#   git -C /work/main archive --prefix=new/ $T | tar -x -C $d
# and run on the device (carry .dev/mlafin27, timeout_s 300):
#   cd .dev/mlafin27 && OUT=$OUT bash new/dev/mlafin27/gpu_check.sh base new
set -uo pipefail
base=$(cd "$1" && pwd); new=$(cd "$2" && pwd)
out=${OUT:-gpu_check_out}; mkdir -p "$out"
steps=" ${KVA_GC_STEPS:-build test res} "
has() { [[ "$steps" == *" $1 "* ]]; }
W=/tmp/mlafin27_gc; B=/tmp/mlafin27_bin
TESTS="test_cuda_mla test_cuda_mla_sparse test_cuda_mla_run test_cuda_attn"
OBJS="mla_decode_mma mla_decode_mma_fp8 mla_decode_wgmma mla_sparse mla_sparse_wgmma decode_mma
      decode_mma_quant decode_mma_quant_fp8 decode_mma_quant_i8 decode_mma_quant_v16"
OD=CMakeFiles/kvattn_obj.dir/src/attn/cuda
status=0; t0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader | tee "$out/gpu.txt"
if has build; then
  rm -rf "$W" "$B"; mkdir -p "$B/base" "$B/new"; cp -r "$base" "$W"; rm -rf "$W"/build*
  s=$(date +%s)
  cmake -S "$W" -B "$W/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF \
    -DKVA_WITH_CJSON=OFF -DKVA_WITH_MPI=OFF -DKVA_WITH_NCCL=OFF >"$out/cmake.log" 2>&1 ||
    { tail -20 "$out/cmake.log"; exit 1; }
  timeout 250 ninja -C "$W/build" -j16 $TESTS >"$out/build_base.log" 2>&1 || { tail -40 "$out/build_base.log"; exit 1; }
  for t in $TESTS; do cp "$W/build/$t" "$B/base/"; done
  for o in $OBJS; do cp "$W/build/$OD/$o.cu.o" "$B/base/" 2>/dev/null; done
  echo "build base: $(( $(date +%s) - s )) s"
  s=$(date +%s)
  (cd "$new" && find . -type f ! -path './build*') | while read -r f; do
    cmp -s "$new/$f" "$W/$f" || { mkdir -p "$(dirname "$W/$f")"; cp "$new/$f" "$W/$f"; echo "$f"; }
  done >"$out/changed.txt"
  timeout 200 ninja -C "$W/build" -j16 $TESTS >"$out/build_new.log" 2>&1 || { tail -40 "$out/build_new.log"; exit 1; }
  for t in $TESTS; do cp "$W/build/$t" "$B/new/"; done
  for o in $OBJS; do cp "$W/build/$OD/$o.cu.o" "$B/new/" 2>/dev/null; done
  echo "build new: $(( $(date +%s) - s )) s ($(grep -c . "$out/changed.txt") files differ: $(tr '\n' ' ' <"$out/changed.txt"))"
fi
if has test; then
  trees=new; [ "${KVA_GC_BASE_TESTS:-1}" = 1 ] && trees="new base"
  for tree in $trees; do
    for t in $TESTS; do
      s=$(date +%s)
      KVA_TEST_QUICK=1 timeout 120 "$B/$tree/$t" >"$out/test_${t}_$tree.log" 2>&1
      rc=$?; [ $rc = 0 ] || [ $tree = base ] || status=1
      echo "test $t ($tree, quick): rc=$rc, $(( $(date +%s) - s )) s, $(grep -c 'FAIL' "$out/test_${t}_$tree.log") FAIL lines; $(tail -1 "$out/test_${t}_$tree.log")"
    done
  done
fi
if has res; then
  CUOBJDUMP=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump); export CUOBJDUMP
  : >"$out/res_base.txt"; : >"$out/res_new.txt"; : >"$out/ptx_cmp.txt"; : >"$out/sass_loop.txt"
  for o in $OBJS; do
    [ -f "$B/base/$o.cu.o" ] && [ -f "$B/new/$o.cu.o" ] || { echo "res: $o.cu.o missing"; continue; }
    for tree in base new; do
      python3 "$new/scripts/sass_stats.py" "$B/$tree/$o.cu.o" | sed "s|^|$o: |" >>"$out/res_$tree.txt"
    done
    python3 "$new/dev/mlafin27/ptx_cmp.py" "$B/base/$o.cu.o" "$B/new/$o.cu.o" | sed "s|^|$o: |" >>"$out/ptx_cmp.txt"
    python3 "$new/dev/mlafin27/sass_loop.py" "$B/base/$o.cu.o" "$B/new/$o.cu.o" | sed "s|^|$o: |" >>"$out/sass_loop.txt"
  done
  python3 "$new/dev/mlafin27/res_table.py" "$out/res_base.txt" "$out/res_new.txt" | tee "$out/res_table.txt" | cut -c1-150
  echo "ptx (ptx_cmp.txt): $(grep -c ': identical' "$out/ptx_cmp.txt") kernels identical, $(grep -c ': differs' "$out/ptx_cmp.txt") differ; key loop (first..last mma) changed in:"
  grep ': differs' "$out/ptx_cmp.txt" | grep -v ', 0 between' | cut -c1-170
  echo "sass key loop (sass_loop.txt): $(grep -c ' same ' "$out/sass_loop.txt") same stream, $(grep -c 'DIFFERS' "$out/sass_loop.txt") differ (counts: first..last HMMA/HGMMA)"
fi
if has sanitize; then
  for t in test_cuda_mla_sparse test_cuda_mla; do
    KVA_TEST_QUICK=1 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/new/$t" \
      >"$out/memcheck_$t.log" 2>&1 &
  done
  wait
  for t in test_cuda_mla_sparse test_cuda_mla; do
    grep -q "ERROR SUMMARY: 0 errors" "$out/memcheck_$t.log" || status=1
    echo "memcheck $t quick (new): $(grep -E 'ERROR SUMMARY' "$out/memcheck_$t.log" | tail -1)"
  done
fi
echo "total: $(( $(date +%s) - t0 )) s, status $status"
exit $status
