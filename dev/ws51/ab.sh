#!/usr/bin/env bash
# dev/ws51/ab.sh - one H200 call for ws51, rerun by ws52 (which fixed what ws51's call found):
# graph-mode memory (kva_cuda_context_reserve's exact workspace; plan uploads staging only the
# bytes they copy, in a large staging ring sized by the uploads instead of two metadata buffers).
# Base = main, new = the branch, source trees staged side by side (git archive) in
# .dev/NAME/base and .dev/NAME/new; everything is built here.
#   build  both trees in parallel (-j8 each; optional libraries off): base libkvattn.so, new
#          libkvattn.so + test_cuda_reserve, test_cuda_plan_update, test_cuda_graph,
#          test_cuda_cascade
#   mem    dev/ws51/mem.py (dev/py50/mem.py's SGLang-sized graph-mode wrappers + 20 timed plans
#          of a 2k-token step) base then new, alone on the GPU; a second round new then base at
#          the end while the call is under WS_MEM2_MAX (185) s
#   tests  new, in parallel: test_cuda_reserve whole; test_cuda_plan_update's cases in 5
#          processes (quick); test_cuda_graph, test_cuda_cascade quick; tests/python -k graph
#   faults planted in new's cuda_meta.cu one at a time (rebuild of the test only), each must FAIL:
#          F3 packed staging slots overlap (need advances by half a range):
#             test_update_sequence_reserved, test_update_pipelined
#          F2 the large ring's growth frees its old halves without waiting for their copies:
#             test_update_grow_pad (passes if cudaFreeHost itself waits: it does on the H200,
#             580.159.04, CUDA 13, which the probe below shows; ws51's and ws52's calls)
#          F1 kva_cuda_context_reserve's workspace with headroom again: test_reserved_bound_mha
#          F4 (ws52, cuda_plan.cu) the reserve bound ignores q_len > 1 (rows of a one-row item):
#             test_reserved_bound_mla (its speculative-decode shape)
#   probe  dev/ws52/freehost_probe.cu: does cudaFreeHost wait for a copy queued from its buffer?
# Build folders: /tmp/<staging folder name>{b,n}, made afresh (a warm machine may hold another
# call's, configured for other source paths). The library target is libkvattn.so ("kvattn" is
# the CLI's file name, so `ninja kvattn` builds the CLI).
# usage (device): run(command="bash .dev/NAME/new/dev/ws51/ab.sh", carry=[".dev/NAME"],
#                     kind="nvidia-h200", timeout_s=300)   (NAME: ws51, ws52)
set -uo pipefail
out=${OUT:-/tmp/ws51_out}; mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd); NT=$(cd "$here/../.." && pwd); BT=$(cd "$NT/../base" && pwd)
L=/tmp/ws51_l; rm -rf $L; mkdir -p $L; t0=$(date +%s)
el() { echo $(( $(date +%s) - t0 )); }
log() { tee -a "$out/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader |
  sed 's/^/# gpu: /' | log
TESTS="test_cuda_reserve test_cuda_plan_update test_cuda_graph test_cuda_cascade"
F="-G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DKVA_BUILD_TESTS=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF -DKVA_WITH_CJSON=OFF -DKVA_WITH_MPI=OFF -DKVA_WITH_NCCL=OFF"
TAG=$(basename "$(cd "$NT/.." && pwd)"); BB=/tmp/${TAG}b; BN=/tmp/${TAG}n; rm -rf $BB $BN
( cmake -S $BT -B $BB $F >$L/cfg_b.log 2>&1 && ninja -C $BB -j8 libkvattn.so >$L/build_b.log 2>&1
  echo "base build rc=$?" ) &
( cmake -S $NT -B $BN $F >$L/cfg_n.log 2>&1 && ninja -C $BN -j8 libkvattn.so $TESTS >$L/build_n.log 2>&1
  echo "new build rc=$?" ) &
wait
[ -f $BB/libkvattn.so ] && [ -f $BN/libkvattn.so ] && [ -x $BN/test_cuda_reserve ] ||
  { grep -a -m20 -A3 error $L/build_*.log | log; cp $L/*.log "$out/" 2>/dev/null; exit 1; }
echo "[$(el) s] built" | log

mem() { # side
  local B=$BB T=$BT; [ $1 = new ] && B=$BN T=$NT
  ( cd $T && KVATTN_LIBRARY=$B/libkvattn.so PYTHONPATH=$T/python timeout 60 \
      python3 $NT/dev/ws51/mem.py $1 >>"$out/mem.txt" 2>&1; echo "mem $1 rc=$?" >>"$out/mem.txt" )
}
mem base; mem new
echo "[$(el) s] mem round 1" | log

tst() { # log name, env..., binary
  local n=$1; shift
  env "$@" >$L/t_$n.log 2>&1; local rc=$?
  echo "$n rc=$rc: $(grep -aE 'passed|FAILED|CHECK failed|failed' $L/t_$n.log | head -3 | tr '\n' ' ' | cut -c1-220)"
}
Q="KVA_TEST_QUICK=1"; TO="timeout ${WS_TEST_TIMEOUT:-60}"
(
  tst reserve $TO $BN/test_cuda_reserve &
  tst pu_grow KVA_TEST_ONLY=test_update_grow_pad,test_update_mixed_pad $Q $TO $BN/test_cuda_plan_update &
  tst pu_pipe KVA_TEST_ONLY=test_update_pipelined,test_staging_hot $Q $TO $BN/test_cuda_plan_update &
  tst pu_seq KVA_TEST_ONLY=test_update_sequence,test_update_sequence_reserved,test_update_decode_steps $Q $TO $BN/test_cuda_plan_update &
  tst pu_unpad KVA_TEST_ONLY=test_update_unpadded $Q $TO $BN/test_cuda_plan_update &
  tst pu_pad KVA_TEST_ONLY=test_update_padded $Q $TO $BN/test_cuda_plan_update &
  tst graph $Q $TO $BN/test_cuda_graph &
  tst cascade $Q $TO $BN/test_cuda_cascade &
  ( cd $NT/tests/python && KVATTN_LIBRARY=$BN/libkvattn.so PYTHONPATH=$NT/python $TO \
      python3 -m pytest -q -p no:cacheprovider -k "graph or reserve" . >$L/t_pytest.log 2>&1
    echo "pytest -k 'graph or reserve' rc=$?: $(tail -1 $L/t_pytest.log | cut -c1-200)" ) &
  wait
) 2>&1 | log
grep -ah "MiB reserved" $L/t_reserve.log | log
echo "[$(el) s] tests" | log

fault() { # tag, python edit of cuda_meta.cu (or of $FF), KVA_TEST_ONLY, binary
  [ "$(el)" -lt ${WS_FAULT_MAX:-150} ] || { echo "fault $1: skipped (time)" | log; return; }
  local f=$NT/src/attn/cuda/${FF:-cuda_meta.cu}
  cp $f $L/meta.orig
  python3 -c "import sys; p=sys.argv[1]; s=open(p).read(); a,b=sys.argv[2].split('=>'); assert a in s, a; open(p,'w').write(s.replace(a,b,1))" $f "$2" ||
    { echo "fault $1: edit did not apply" | log; return; }
  if ninja -C $BN $4 >$L/fb_$1.log 2>&1; then
    tst fault_$1 KVA_TEST_ONLY=$3 $Q $TO $BN/$4 | sed 's/^/(must FAIL) /' | log
  else echo "fault $1: build failed" | log; fi
  cp $L/meta.orig $f
}
FF=cuda_plan.cu fault F4 "const int64_t q_max = cap->max_tokens > 1 ? cap->max_tokens : 1;=>const int64_t q_max = 1;" \
  test_reserved_bound_mla test_cuda_reserve
fault F1 "return workspace_grow(ctx, ws, 0);=>return workspace_grow(ctx, ws, 1);" \
  test_reserved_bound_mha test_cuda_reserve
fault F3 "need += align256(sr.hi[r] - sr.lo[r]);=>need += align256((sr.hi[r] - sr.lo[r]) / 2);" \
  test_update_sequence_reserved,test_update_pipelined test_cuda_plan_update
fault F2 "e = cudaEventSynchronize((cudaEvent_t)r->events[i]);=>e = cudaSuccess;" \
  test_update_grow_pad test_cuda_plan_update
ninja -C $BN test_cuda_plan_update test_cuda_reserve >/dev/null 2>&1 # back to new
echo "[$(el) s] faults" | log
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
( $NVCC -O2 -arch=sm_90a $NT/dev/ws52/freehost_probe.cu -o $L/fhp && timeout 20 $L/fhp ) 2>&1 | log

if [ "$(el)" -lt ${WS_MEM2_MAX:-160} ]; then mem new; mem base; fi
echo "== mem.py (quote the n = 2 lines; columns: device MiB, pinned MiB after the first plan,"\
  "pinned MiB added by the steps, first plan ms, step plan us)" | log
grep -aE "^(GPU|case|decode|MLA)|rc=" "$out/mem.txt" | log
cp $L/t_*.log $L/fb_*.log "$out/" 2>/dev/null
( cd "$out" && tar -czf logs.tgz t_*.log fb_*.log 2>/dev/null && rm -f t_*.log fb_*.log )
echo "[$(el) s] done" | log
