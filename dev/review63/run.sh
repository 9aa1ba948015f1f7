#!/usr/bin/env bash
# dev/review63/run.sh - one H200 call (not run: session 44's device budget was spent): review63's additions to
# tests/cuda/test_cuda_mla_gemm.c on the real kernels, and two planted faults that main's copy of the test passes.
# Staged in .dev/review63: ./new (git archive of branch review63). Call:
#   run(command="bash .dev/review63/new/dev/review63/run.sh", carry=[".dev/review63"], kind="nvidia-h200", timeout_s=240)
# Steps: build new's test_cuda_mla_gemm (Release, 90a, optional libraries off, -j16); run it whole (must pass: the
# new cases are C2 with its own strides, the pair at N 256 / K 64, a pair with C2 only 4-byte aligned); then for
# each planted fault (FAULTS, default "1 4"), sed on ./new's mla_gemm_wgmma.cu, rebuild only that object and the
# test, run the test whole (must fail), restore the source:
#   1: the epilogue stores both products with the first product's row and head strides (p.ldc[0], p.c_head[0]);
#   4: the dispatch no longer requires C2 16-byte aligned (the pair form's 16-byte stores then meet a 4-aligned C2).
# Log $OUT/review63.txt; a short summary is printed last.
set -uo pipefail
st=$(cd "$(dirname "$0")/../../.." && pwd) # the staged folder (.dev/review63)
res=${OUT:-$st/out}; mkdir -p "$res"; L=$res/review63.txt; tmp=/tmp/review63_logs; mkdir -p "$tmp"
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; T() { echo "## $1: $(el) s" >>"$L"; }
echo "# review63 call, $(date -u '+%F %T') UTC" >>"$L"
echo "# gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1); $(nproc) cores" >>"$L"
CM="-G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DKVA_WITH_OPENSSL=OFF
  -DKVA_WITH_XXHASH=OFF -DKVA_WITH_CJSON=OFF -DKVA_WITH_MPI=OFF -DKVA_WITH_NCCL=OFF"
N=/tmp/review63_new; src="$st/new/src/attn/cuda/mla_gemm_wgmma.cu"
{ cmake -S "$st/new" -B $N $CM && timeout 150 ninja -C $N -j"${J:-16}" test_cuda_mla_gemm; } >"$tmp/build.log" 2>&1
nrc=$?
T "build new rc=$nrc"
grep -m10 -E "error|Error" "$tmp/build.log" | cut -c1-300 >>"$L"
summary="build rc=$nrc"
if [ $nrc = 0 ]; then
  timeout 60 $N/test_cuda_mla_gemm >"$tmp/clean.log" 2>&1; rc=$?
  echo "test_cuda_mla_gemm whole (must pass) rc=$rc: $(grep -a "passed" "$tmp/clean.log" | tail -1)" >>"$L"
  grep -aE "sm_90a|mismatches" "$tmp/clean.log" >>"$L"
  summary="$summary | clean rc=$rc ($(grep -a "passed" "$tmp/clean.log" | tail -1))"
  T clean
  cp "$src" "$tmp/orig.cu"
  for f in ${FAULTS:-1 4}; do
    cp "$tmp/orig.cu" "$src"
    case $f in
      1) sed -i 's/gw_store<TR>(acc\[q\], p.c\[q\], p.ldc\[q\], p.c_head\[q\], p, tl, cs);/gw_store<TR>(acc[q], p.c[q], p.ldc[0], p.c_head[0], p, tl, cs); \/\/ FAULT/' "$src" ;;
      4) sed -i 's/(!g->b2 || (uintptr_t)g->c2 % 16 == 0) \&\&/\/* FAULT *\/ /' "$src" ;;
    esac
    if grep -q "FAULT" "$src" && timeout 90 ninja -C $N test_cuda_mla_gemm >"$tmp/fault$f.build" 2>&1; then
      timeout 60 $N/test_cuda_mla_gemm >"$tmp/fault$f.log" 2>&1; rc=$?
      line="fault $f (must fail): rc=$rc, $(grep -a "passed" "$tmp/fault$f.log" | tail -1); runs with mismatches: $(grep -a "mismatches$" "$tmp/fault$f.log" | grep -vc ": 0 mismatches")"
      echo "$line" >>"$L"
      grep -a -m4 "CHECK failed" "$tmp/fault$f.log" | cut -c1-250 >>"$L"
    else
      line="fault $f: not applied or not built"; echo "$line" >>"$L"; tail -5 "$tmp/fault$f.build" >>"$L" 2>/dev/null
    fi
    summary="$summary | $line"
    T "fault $f"
  done
  cp "$tmp/orig.cu" "$src"
fi
T done
echo "$summary" | tr "|" "\n" | tee -a "$L"
