#!/usr/bin/env bash
# Lead's final call of a session: base (main at the session's start) vs new (merged main), one GPU.
# Trees in ./base and ./new, .deb build deps in ./debs. Log: $OUT/final.txt (written as it goes).
# Knobs: CTJ=3 (ctest jobs per GPU), SAN="test_a test_b" (memcheck quick), MLA=1 (MLA rows), SPARSE=1 (sparse suite),
#        PEER=1 (SDPA short shapes), R2=1 (second round), DCP=1 (emulated DCP rows), DCPG=1 (graph-replayed
#        one-request decodes at 128k / 64k / 32k), SERVE_R=4 (serve-sim rounds per tree),
#        SPARSE1=1 (the sparse MLA decode rows of issue 17, heads SPARSE1_H="128 16 64"), PY=1 (tests/python with the machine's torch after the CUDA tests).
# A folder ./fi (fi-slim.tgz, fi-jit.tgz from bench/flashinfer_prebuild.sh, whl/apache_tvm_ffi-*-cpXY-*.whl) adds
# FlashInfer's paged prefill rows to the peer call, and its paged decode rows (bench/decode_fi_peer.py, beside
# bench_cuda's decode rows) when fi-jit.tgz holds the decode modules.
# On a machine with several GPUs the CUDA tests are dealt round-robin to GPUs 1..N-1 and run there while
# the benchmarks run on GPU 0 (serve-sim, whose host timings the tests' CPU load would disturb, waits for them).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd); cd "$here"
# $OUT gets final.txt (written as it goes), ctest.log and logs.tgz only: the device tool brings back 8 files.
res=${OUT:-$here/out}; out=/tmp/final_logs; mkdir -p "$out" "$res"; LOG=$res/final.txt
export KVA_DEBS=$here/debs; . new/scripts/device_deps.sh; kx=(${KVA_DEP_ARGS[@]+"${KVA_DEP_ARGS[@]}"})
echo "# gpu: $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader)" >>"$LOG"
B=/tmp/fb; t0=$(date +%s); T() { echo "## $1: $(( $(date +%s) - t0 )) s" >>"$LOG"; }
el() { echo $(( $(date +%s) - t0 )); }
for t in base new; do
  cmake -S $t -B $B/$t -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
    "${kx[@]}" >$out/cmake_$t.log 2>&1 || { tail -20 $out/cmake_$t.log; exit 1; }
done
# The new tree first with every core, then base's bench binaries beside the tests: a call cut short
# by its limit still brings back the merged tree's test results.
J=$(nproc); NG=$(nvidia-smi -L | wc -l); echo "# $NG GPU(s), $J cores" >>"$LOG"
ninja -C $B/new -j$J >$out/build_new.log 2>&1 || { grep -m20 error $out/build_new.log; tail -3 $out/build_new.log; exit 1; }
T build-new
ninja -C $B/base -j$(( J > 16 ? J / 2 : 6 )) bench_cuda bench_cuda_mla kvattn >$out/build_base.log 2>&1 &
bpid=$!
( for x in ${SAN:-}; do
    CUDA_VISIBLE_DEVICES=$(( NG > 1 ? NG - 1 : 0 )) KVA_TEST_QUICK=1 timeout 170 compute-sanitizer --tool memcheck --error-exitcode 9 $B/new/$x >$out/san_$x.log 2>&1
    echo "memcheck $x quick: rc=$? $(grep -E 'ERROR SUMMARY' $out/san_$x.log | tail -1)" >>"$LOG"; done ) &
ctests() { # the quick CUDA tests: on GPU 0 alone, or dealt to GPUs 1..NG-1
  if [ "$NG" -lt 2 ]; then
    KVA_TEST_QUICK=1 ctest --test-dir $B/new -L cuda -j${CTJ:-3} --timeout 240 --output-on-failure >"$res/ctest.log" 2>&1
    echo "ctest -L cuda (quick) rc=$?" >>"$LOG"
  else
    mapfile -t names < <(ctest --test-dir $B/new -N -L cuda | sed -n 's/^ *Test *#[0-9]*: //p')
    local g i pids=() rc=0
    for g in $(seq 1 $((NG - 1))); do
      local sel=() 
      for i in "${!names[@]}"; do [ $((i % (NG - 1) + 1)) = $g ] && sel+=("${names[$i]}"); done
      [ ${#sel[@]} = 0 ] && continue
      local re="^($(IFS='|'; echo "${sel[*]}"))\$"
      CUDA_VISIBLE_DEVICES=$g KVA_TEST_QUICK=1 ctest --test-dir $B/new -R "$re" -j${CTJ:-3} --timeout 240 --output-on-failure >"$out/ctest_gpu$g.log" 2>&1 &
      pids+=($!)
    done
    for i in "${pids[@]}"; do wait $i || rc=1; done
    cat "$out"/ctest_gpu*.log >"$res/ctest.log"; echo "ctest -L cuda (quick, GPUs 1..$((NG - 1))) rc=$rc" >>"$LOG"
  fi
  grep -E "tests passed|Failed|\*\*\*|Not Run" "$res/ctest.log" | tail -14 >>"$LOG"; T tests
  if [ "${PY:-1}" = 1 ]; then # tests/python with the machine's torch, on the CUDA build's libkvattn.so
    # (several GPUs: on the last one, as memcheck, not on GPU 0 under the benchmarks)
    (cd new/tests/python && CUDA_VISIBLE_DEVICES=$(( NG > 1 ? NG - 1 : 0 )) KVATTN_LIBRARY=$B/new/libkvattn.so \
      PYTHONPATH=$here/new/python timeout 240 \
      python3 -m pytest -q -p no:cacheprovider . >$out/pytest.log 2>&1); local prc=$?
    echo "pytest tests/python (CUDA build, torch $(python3 -c 'import torch; print(torch.__version__)' 2>&1)) rc=$prc: $(tail -1 $out/pytest.log)" >>"$LOG"
    grep -E "^FAILED|Error" $out/pytest.log | head -10 >>"$LOG"; T py; fi; }
if [ "$NG" -lt 2 ]; then ctests; else ctests & tpid=$!; export CUDA_VISIBLE_DEVICES=0; fi
wait $bpid || { tail -20 $out/build_base.log; exit 1; }
[ "$NG" -lt 2 ] && { wait; T san; }
bc() { local tag=$1; shift; echo "$tag $("$B/${tag%%-*}/bench_cuda" "$@" 2>&1 >/dev/null | grep -m1 '^bench_cuda:')" >>"$LOG"; }
D="--mode decode"; P="--mode prefill --context 0 --iters 20"
bench_round() { local r=$1; for t in base new; do
  for s in "16 1023" "16 4095" "64 4095" "1 131071"; do set -- $s; bc $t-r$r $D --batch $1 --context $2; done
  for q in int8 int8-token fp8; do bc $t-r$r $D --batch 64 --context 4095 --quant $q; done
  bc $t-r$r $P --batch 32 --q-len 256; bc $t-r$r $P --batch 8 --q-len 1024; bc $t-r$r $P --batch 2 --q-len 2048
  bc $t-r$r $P --batch 1 --q-len 4096
  bc $t-r$r --mode prefill --context 3072 --iters 20 --batch 4 --q-len 1024
  bc $t-r$r $P --batch 1 --q-len 4096 --heads 16 --kv-heads 4 --head-dim 256
  bc $t-r$r $P --batch 1 --q-len 4096 --head-dim 64
  if [ "${MLA:-1}" = 1 ]; then
  for s in "128 16384 16 1 none" "128 4096 128 1 none" "128 8192 128 2 none" "128 4096 128 1 fp8"; do set -- $s
    echo "$t-r$r mla $5 $($B/$t/bench_cuda_mla --batch $1 --context $2 --heads $3 --q-len $4 --block-size 64 --kv-quant $5 2>&1 >/dev/null | grep -m1 '^bench_cuda_mla:')" >>"$LOG"
  done; fi
  if [ "${DCP:-1}" = 1 ]; then for n in 4 2; do
    $B/$t/kvattn bench --backend cuda --dcp $n --batch 1 --seq-len 131072 >$out/dcp_${t}_$n.log 2>&1
    echo "$t-r$r dcp N$n R1 rc=$?" >>"$LOG"; grep -E "dcp:|unsharded|rank|slowest" $out/dcp_${t}_$n.log | sed "s/^/$t-r$r /" >>"$LOG"
  done; fi
done; T "bench r$r"; }
bench_round 1
for b in "" "--copy-bytes 33554432" "--copy-bytes 67108864" "--copy-bytes 134217728" "--copy-bytes 268435456" "--copy-bytes 536870912"; do bc new-r1 --mode copy $b; done
if [ "${PEER:-1}" = 1 ]; then
if [ -d fi ]; then # FlashInfer's rows from the JIT module bench/flashinfer_prebuild.sh compiled on the dev VM
  fs=/tmp/fi_site; fj=/tmp/fi_jit; mkdir -p $fs $fj; pyv=$(python3 -c 'import sys; print("%d%d" % sys.version_info[:2])')
  pip install -q --no-deps --target $fs fi/whl/apache_tvm_ffi-*-cp$pyv-*.whl >$out/fi_pip.log 2>&1
  tar -xzf fi/fi-slim.tgz -C $fs && tar -xzf fi/fi-jit.tgz -C $fj
  ( cd new && PYTHONPATH=$fs KVA_FI_PREBUILT=$fj timeout 150 python3 -u bench/prefill_sdpa_peer.py short ) >$out/sdpa_peer.log 2>&1
  prc=$?
  if ls $fj | grep -q '^batch_decode_with_kv_cache'; then # its paged decode on bench_cuda's decode shapes
    ( cd new && PYTHONPATH=$fs KVA_FI_PREBUILT=$fj timeout 90 python3 -u bench/decode_fi_peer.py ) >$out/fi_decode.log 2>&1
    echo "fi decode peer rc=$?" >>"$LOG"; grep -E '^#? ?fi-decode' $out/fi_decode.log | cut -c1-200 >>"$LOG"
  fi; (exit $prc)
else
( cd new && timeout 90 python3 -u -c "import sys; sys.path.insert(0, 'bench'); sys.modules['flashinfer'] = None; sys.argv = ['p', 'short']; exec(open('bench/prefill_sdpa_peer.py').read())" ) >$out/sdpa_peer.log 2>&1
fi; echo "sdpa peer rc=$?" >>"$LOG"
grep -iE 'cudnn|flash|matmul' $out/sdpa_peer.log | cut -c1-150 >>"$LOG"; T peer; fi
[ "$NG" -ge 2 ] && { wait; T "tests and san"; }
for r in $(seq 1 ${SERVE_R:-4}); do for t in base new; do
  $B/$t/kvattn serve-sim --backend cuda --no-progress >$out/serve_$t.log 2>&1
  echo "$t serve r$r rc=$? $(grep -E 'plan share|Mean step' $out/serve_$t.log | tr -s ' ' | tr '\n' ';')" >>"$LOG"
done; done
T serve
if [ "${DCPG:-1}" = 1 ]; then for t in base new; do for c in 131072 65536 32768; do
  # one request's decode at a 128k context and its 2- and 4-way shares, replayed from a graph of 10 layers
  # (issue 19's emulated per-rank ratio as an engine's decode graph sees it): the json's graph_ms_per_layer
  echo "$t dcpg ctx $c $("$B/$t/bench_cuda" --mode decode --batch 1 --context $c --heads 32 --kv-heads 8 --head-dim 128 --iters 50 --graph-layers 10 2>/dev/null | grep -o '"ms": [0-9.]*\|"graph_ms_per_layer": [0-9.]*\|"items": [0-9]*' | tr '\n' ' ')" >>"$LOG"
done; done; T dcpg; fi
if [ "${SPARSE1:-1}" = 1 ]; then for r in 1 2; do for t in base new; do # issue 17's decode rows, alternated twice:
  for h in ${SPARSE1_H:-128 16 64}; do # H 128, and H 16 against the same call padded to 64 heads
  echo "$t-r$r sparse1 $(timeout 60 $B/$t/kvattn bench --mla-sparse --backend cuda --batch 128 --q-len 2 --context 8192 --heads $h --topk 2048 --iters 5 2>&1 | grep -E ' ms ' | tail -1 | tr -s ' ')" >>"$LOG"
done; done; done; T sparse1; fi
if [ "${SPARSE:-0}" = 1 ]; then for t in base new; do
  timeout 80 $B/$t/kvattn bench --mla-sparse --backend cuda --iters 20 >$out/sparse_$t.log 2>&1
  echo "$t sparse rc=$?" >>"$LOG"; grep -E "TFLOP/s" $out/sparse_$t.log | sed "s/^/$t sparse: /" | cut -c1-170 >>"$LOG"
done; T sparse; fi
[ "${R2:-1}" = 1 ] && [ "$(el)" -lt "${R2_BEFORE:-380}" ] && bench_round 2
T end
tar -czf "$res/logs.tgz" -C "$out" .
grep -E "^(base|new|fi-decode)|## |rc=|memcheck" "$LOG" | grep -vE "rank [0-9]+ +[0-9.]+ ms|unsharded +[0-9.]+ ms|dcp: N" | sed -E 's/bench_cuda(_mla)?: //; s/, [0-9]+ items.*check/ check/' | cut -c1-140 | tail -80
