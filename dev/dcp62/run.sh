#!/usr/bin/env bash
# dev/dcp62/run.sh - split partials into the DCP combine (kva_plan_desc.dcp_parts), one GPU call.
# Trees in ./base (main) and ./new (branch dcp62), both under .dev/dcp62:
#   run(command="bash .dev/dcp62/new/dev/dcp62/run.sh", carry=[".dev/dcp62"], kind="nvidia-h200", timeout_s=200)
# 1) builds both (90a, optional libs off; base: libkvattn.so; new: it and the tests below), and
#    dev/dcp62/step.cu against each (new with -DHAVE_PARTS);
# 2) the new tree's tests: test_cuda_dcp (whole: split partials included), test_dcp (ref / CPU),
#    test_cuda_attn's decode groups (quick);
# 3) one rank's step (its sharded decode + the combine of the N ranks' parts, the others precomputed)
#    against the unsharded decode, per call and graph-replayed: 1 x 128k N 4, 1 x 64k N 2, 8 x 128k N 4;
#    base, new P 0 (merged), new P 8 / 32 (split partials), alternated, KVA_ROUNDS rounds (2).
# Log: $OUT/dcp62.txt; the table last. KVA_STUB=1: no cmake / nvcc / GPU (shell logic on the VM).
# KVA_SECOND=1 (the staged second call, merge_wide_kernel): new builds and runs test_cuda_dcp only,
# and the variants are base, new P 32, new P 8 (no new P 0).
set -u -o pipefail
here=$(cd "$(dirname "$0")/../../.." && pwd); cd "$here" # .dev/dcp62: base/ and new/
res=${OUT:-$here/out}; L=/tmp/dcp62_logs; mkdir -p "$res" "$L"; LOG=$res/dcp62.txt; : > "$LOG"
t0=$(date +%s); T() { echo "## $1: $(( $(date +%s) - t0 )) s" >>"$LOG"; }
x() { if [ "${KVA_STUB:-0}" = 1 ]; then echo "stub: $*" >>$L/stub.log; else "$@"; fi; }
[ "${KVA_STUB:-0}" = 1 ] || echo "# gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); $(nproc) cores" >>"$LOG"
F="-G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DKVA_BUILD_TESTS=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF -DKVA_WITH_CJSON=OFF -DKVA_WITH_MPI=OFF -DKVA_WITH_NCCL=OFF"
BB=/tmp/dcp62b; BN=/tmp/dcp62n
build() { # tree dir targets... ; then step against it
  local t=$1 d=$2; shift 2
  x cmake -S $here/$t -B $d $F >$L/cfg_$t.log 2>&1 && x timeout 150 ninja -C $d -j8 "$@" >$L/build_$t.log 2>&1 || { echo "$t build failed" >>"$LOG"; return 1; }
  local def=; [ $t = new ] && def=-DHAVE_PARTS
  x timeout 60 nvcc -O2 -arch=sm_90a $def -I$here/$t/include $here/new/dev/dcp62/step.cu -o $d/step -L$d -lkvattn -Xlinker -rpath=$d >$L/step_$t.log 2>&1 || { echo "$t step build failed" >>"$LOG"; return 1; }
  echo "$t built" >>"$LOG"
}
build base $BB libkvattn.so & pb=$!
NT="test_cuda_dcp test_dcp test_cuda_attn"; [ "${KVA_SECOND:-0}" = 1 ] && NT=test_cuda_dcp
build new $BN libkvattn.so $NT & pn=$!
wait $pb; rb=$?; wait $pn; rn=$?
T build
if [ $rb != 0 ] || [ $rn != 0 ]; then grep -a -m20 -E "error" $L/build_*.log $L/step_*.log >>"$LOG"; cat "$LOG"; exit 1; fi
# Tests of the new tree (correctness before timing), in parallel, then nothing else on the GPU.
( x timeout 100 $BN/test_cuda_dcp >$L/t_cuda_dcp.log 2>&1; echo "test_cuda_dcp rc=$?: $(grep -aE 'passed|FAIL|differ|parts' $L/t_cuda_dcp.log | tail -3 | tr '\n' ' ' | cut -c1-300)" >>"$LOG" ) &
[ "${KVA_SECOND:-0}" = 1 ] || ( x timeout 100 $BN/test_dcp >$L/t_dcp.log 2>&1; echo "test_dcp rc=$?: $(grep -aE 'passed|FAIL' $L/t_dcp.log | tail -2 | tr '\n' ' ')" >>"$LOG" ) &
[ "${KVA_SECOND:-0}" = 1 ] || ( KVA_TEST_ONLY=test_grid,test_decode_mma,test_split_kv,test_many_items,test_mma_mixed,test_dcp_plans KVA_TEST_QUICK=1 x timeout 100 $BN/test_cuda_attn >$L/t_attn.log 2>&1
  echo "test_cuda_attn (decode groups, quick) rc=$?: $(grep -aE 'passed|FAIL' $L/t_attn.log | tail -2 | tr '\n' ' ')" >>"$LOG" ) &
wait; T tests
# The step rows: config "N L R"; variants base / new P.
C=("4 131072 1" "2 65536 1" "4 131072 8")
for rd in $(seq 1 ${KVA_ROUNDS:-2}); do
  for c in "${C[@]}"; do set -- $c
    for v in base:0 new:0 new:32 new:8; do t=${v%%:*}; p=${v#*:}; d=$BB; [ $t = new ] && d=$BN
      [ $p = 8 ] && [ $3 = 1 ] && continue # one request: 8 chunks leave SMs idle
      [ $t:$p = new:0 ] && { [ $rd -gt 1 ] || [ "${KVA_SECOND:-0}" = 1 ]; } && continue
      line=$(x timeout 40 $d/step $1 $2 $3 $p 50 2>$L/step_err.txt | tail -1)
      echo "r$rd $t P$p: ${line:-failed: $(tail -2 $L/step_err.txt | tr '\n' ' ')}" >>"$LOG"
    done
  done
  T "round $rd"
done
echo "== table: step = rank 0's sharded decode + the combine of N x P parts; ratio = step / unsharded (median of rounds per call / graph)" >>"$LOG"
grep -a "^r[0-9]" "$LOG" | sed -nE 's/^(r[0-9]+) ([a-z]+ P[0-9]+): step (N [0-9]+ R [0-9]+ L [0-9]+) P -?[0-9]+: check ([a-zA-Z]+).*step eager ([0-9.]+) graph ([0-9.]+) us.*ratio eager ([0-9.]+) graph ([0-9.]+)$/\3 | \2 | \1 | check \4 | step \5 \/ \6 us | ratio eager \7 graph \8/p' | sort >>"$LOG"
tar -czf "$res/logs.tgz" -C "$L" . 2>/dev/null
cat "$LOG"
