#!/usr/bin/env bash
# dev/fi53/peer.sh - one H200 call (issues 16 and 23): kvattn's rows and FlashInfer 0.7.2's in one run, FlashInfer's
# JIT modules prebuilt on the dev VM (bench/flashinfer_prebuild.sh: prefill, 4 decode modules, mla), so nothing of
# FlashInfer compiles here. Staged by dev/fi53/stage.sh in .dev/fi53: ./new (git archive of the tree), ./fi
# (fi-jit.tgz, fi-slim.tgz, whl/apache_tvm_ffi-*-cpXY-*.whl), rev.txt. Call:
#   run(command="bash .dev/fi53/new/dev/fi53/peer.sh", carry=[".dev/fi53"], kind="nvidia-h200", timeout_s=210)
# Steps (each logs to $OUT as it goes; $OUT/peer.txt collects the rows, $OUT/table.txt the short table, printed last):
#   build    bench_cuda + bench_cuda_mla only (Release, 90a, no OpenSSL / xxHash / cJSON, ninja -j16; FlashInfer's
#            site unpacked and its modules checked (decode_fi_peer.py --modules) beside the build)
#   mla      bench/peer_mla.py --heads 128,16 --forced '': ours (bench_cuda_mla, request 0 checked against the
#            reference backend) on R 128 H 16 q 1 4k / 16k, R 64 H 16 32k, R 128 H 128 q 1 4k, q 2 8k, then
#            FlashInfer's BatchMLAPagedAttentionWrapper (backend auto: fa3; its request 0 checked) on the same shapes
#   decode   bench_cuda --mode decode (16 x 1023, 16 x 4095, 64 x 4095, 1 x 131071, 64 x 4095 fp8), then
#            bench/decode_fi_peer.py (the same shapes, FlashInfer's CUDA-core and tensor-core decode)
#   prefill  bench_cuda --mode prefill (32 x 256, 8 x 1024, 2 x 2048, 1 x 4096, 4 x 1024 after 3072), then
#            bench/prefill_sdpa_peer.py short (SDPA flash / cuDNN, FlashInfer's paged prefill)
#   cli      (not in the default) kvattn bench --mla --backend cuda --kernel on the mla step's shapes (builds kvattn)
# Time (estimated from older H200 / H100 logs, not yet measured with this script): build ~60 s, mla ~30 s, decode
# ~25 s, prefill ~25 s: ~150 s; the step timeouts (75 / 45 / 45 s) and LATE bound it near 200 s.
# Knobs: STEPS (default "mla sparse decode prefill"; sparse: kvattn bench --mla-sparse, bf16 vs f16 q), MLA_HEADS (128,16), LATE (seconds: a step not started by then is
# skipped and said so; default 150), J (ninja jobs, nproc), FI (the FlashInfer folder, default ./fi).
set -uo pipefail
st=$(cd "$(dirname "$0")/../../.." && pwd) # the staged folder (.dev/fi53)
res=${OUT:-$st/out}; mkdir -p "$res"; L=$res/peer.txt; tmp=/tmp/fi53_logs; mkdir -p "$tmp"
B=/tmp/fb53; fs=/tmp/fi53_site; fj=/tmp/fi53_jit; mkdir -p $fs $fj; fid=${FI:-$st/fi}
steps=" ${STEPS:-mla sparse decode prefill} "; has() { [[ "$steps" == *" $1 "* ]]; }
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; T() { echo "## $1: $(el) s" >>"$L"; }
late() { [ "$(el)" -le "${LATE:-150}" ] || { echo "## $1 skipped: $(el) s > LATE ${LATE:-150}" >>"$L"; return 1; }; }
echo "# fi53 peer call, $(date -u '+%F %T') UTC, tree $(cat "$st/rev.txt" 2>/dev/null)" >>"$L"
echo "# gpu: $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader)" >>"$L"
pyv=$(python3 -c 'import sys; print("%d%d" % sys.version_info[:2])')
echo "# python $pyv, torch $(python3 -c 'import torch; print(torch.__version__)' 2>&1 | tail -1), $(nproc) cores" >>"$L"
# FlashInfer's site beside the build: the tvm-ffi wheel, the package without its sources, the prebuilt modules;
# then every module the three peer scripts load, loaded once (no GPU needed)
# (the wheel holds only tvm_ffi/ and its dist-info: unzipping it installs it where pip is missing)
whl=$(ls "$fid"/whl/apache_tvm_ffi-*-cp$pyv-cp$pyv-*.whl 2>/dev/null | head -1)
( [ -n "$whl" ] || { echo "no tvm-ffi wheel for cp$pyv in $fid/whl"; exit 1; }
  python3 -m pip install -q --no-deps --target $fs "$whl" || python3 -m zipfile -e "$whl" $fs
  tar -xzf "$fid/fi-slim.tgz" -C $fs && tar -xzf "$fid/fi-jit.tgz" -C $fj &&
  cd "$st/new" && PYTHONPATH=$fs KVA_FI_PREBUILT=$fj timeout 60 python3 bench/decode_fi_peer.py --modules
) >$tmp/fi_setup.log 2>&1 &
fpid=$!
tg="bench_cuda bench_cuda_mla"; { has cli || has sparse; } && tg="$tg kvattn_cli"
cmake -S "$st/new" -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF -DKVA_WITH_CJSON=OFF >$tmp/cmake.log 2>&1 &&
  ninja -C $B -j"${J:-$(nproc)}" $tg >$tmp/build.log 2>&1
brc=$?
T "build ($tg) rc=$brc"
wait $fpid; echo "fi setup rc=$? (pip, tar, decode_fi_peer.py --modules)" >>"$L"
grep -E "^module|rror" $tmp/fi_setup.log | cut -c1-200 >>"$L"
if [ $brc != 0 ]; then
  { grep -m20 -E "error|Error" $tmp/build.log $tmp/cmake.log; tail -5 $tmp/build.log; } | cut -c1-300 >>"$L"
  tar -czf "$res/logs.tgz" -C $tmp .; cat "$L"; exit 1
fi
fi_py() { (cd "$st/new" && PYTHONPATH=$fs KVA_FI_PREBUILT=$fj timeout "$@"); }
bc() { echo "ours $("$B/bench_cuda" "$@" 2>&1 >/dev/null | grep -m1 '^bench_cuda:')" >>"$L"; }
if has mla && late mla; then
  fi_py 75 python3 -u bench/peer_mla.py --ours $B/bench_cuda_mla --heads "${MLA_HEADS:-128,16}" --forced '' \
    --out "$res" >"$res/mla.log" 2>&1
  echo "peer_mla rc=$?" >>"$L"
  grep -E "^bench_cuda_mla:|^flashinfer:" "$res/mla.log" | cut -c1-230 >>"$L"
  if grep -q "copy ceiling" "$res/mla.log"; then # the last table (FlashInfer's columns filled)
    tac "$res/mla.log" | sed '/copy ceiling/q' | tac >>"$L"
  else tail -4 "$res/mla.log" >>"$L"; fi
  T mla
fi
if has sparse && late sparse; then # issue 17: H <= 16 over fp8_ds_mla with bf16 and f16 q (the f16 tile is
  # what a cheaper fp8 -> 16-bit conversion could reach), and the same call padded to H 64
  for m in "H16 bf16|--heads 16" "H16 f16|--heads 16 --dtype f16" "H64 bf16 (H16 padded)|--heads 64" \
    "H64 f16 (H16 padded)|--heads 64 --dtype f16"; do
    echo "sparse ${m%%|*}: $(timeout 30 $B/kvattn bench --mla-sparse --backend cuda --iters 20 --batch 128 \
      --q-len 2 --topk 2048 --context 8192 ${m#*|} 2>&1 | grep -E ' ms |FAIL|rror' | tail -1 | tr -s ' ')" >>"$L"
  done; T sparse
fi
if has decode && late decode; then
  D="--mode decode"
  for s in "16 1023" "16 4095" "64 4095" "1 131071"; do set -- $s; bc $D --batch $1 --context $2; done
  bc $D --batch 64 --context 4095 --quant fp8
  fi_py 45 python3 -u bench/decode_fi_peer.py >"$res/fi_decode.log" 2>&1
  echo "decode_fi_peer rc=$?" >>"$L"; grep -E '^#? ?fi-decode' "$res/fi_decode.log" | cut -c1-230 >>"$L"
  T decode
fi
if has prefill && late prefill; then
  P="--mode prefill --context 0 --iters 20"
  bc $P --batch 32 --q-len 256; bc $P --batch 8 --q-len 1024; bc $P --batch 2 --q-len 2048
  bc $P --batch 1 --q-len 4096; bc --mode prefill --context 3072 --iters 20 --batch 4 --q-len 1024
  fi_py 45 python3 -u bench/prefill_sdpa_peer.py short >"$res/sdpa_peer.log" 2>&1
  echo "prefill_sdpa_peer rc=$?" >>"$L"; grep -iE 'cudnn|flash|matmul' "$res/sdpa_peer.log" | cut -c1-160 >>"$L"
  T prefill
fi
if has cli && late cli; then # issue 16's "kvattn bench": the kernel-level absorbed decode through the CLI
  for s in "128 4096 1 16" "128 16384 1 16" "64 32768 1 16" "128 4096 1 128" "128 8192 2 128"; do set -- $s
    echo "cli R=$1 S=$2 Q=$3 H=$4: $(timeout 60 $B/kvattn bench --mla --backend cuda --kernel --batch $1 --context $2 \
      --q-len $3 --heads $4 --block-size 64 --iters 20 --no-ceiling 2>&1 | grep -E 'median|check|FLOP/s|FAIL|rror' |
      tr -s ' ' | tr '\n' ';' |
      cut -c1-400)" >>"$L"
  done; T cli
fi
tar -czf "$res/logs.tgz" -C $tmp .
python3 "$st/new/dev/fi53/table.py" "$L" >"$res/table.txt" 2>&1
T end
tail -3 "$L"; cat "$res/table.txt"
