#!/usr/bin/env bash
# dev/dec40/ab.sh BASE NEW - mid-size paged decode against the copy of its own bytes (issues 23, 20), one
# GPU, one call: BASE and NEW are source trees (e.g. `git archive` of main and of the branch) in one folder.
#   build   NEW first (libkvattn, bench_cuda, the kvattn CLI, the decode tests), its binaries kept; then
#           BASE's differing files copied over the same build tree and only bench_cuda + kvattn rebuilt
#           (no file may be added to or removed from src/)
#   test    (after the bench, so nothing shares the GPU or the cores with it) NEW, quick sets, in
#           parallel: test_cuda_attn's decode cases, test_cuda_quant_attn, test_cuda_dcp, test_cuda_graph,
#           test_cuda_plan_update (its quick set takes 60-130 s: DEC_TEST_TIMEOUT, default 170); memcheck
#           of test_split_kv and test_many_items (test_cuda_attn, quick)
#   bench   rounds (DEC_ROUNDS, default 2) of base, new alternated: bf16 H 32 / Hkv 8 / D 128 / B 16 decodes
#           16 x 1k, 16 x 4k, 64 x 4k, 1 x 128k, 1 x 32k (the 4-way shard of 1 x 128k: its bytes),
#           int8 (C8, INT8_CHANNEL) and fp8 64 x 4k, then `kvattn bench --dcp 4|2 --backend cuda` at
#           1 x 131072; device copies of each row's bytes (read + write = the KV bytes) before and after
#   ncu     NEW's decode kernel at 16 x 4k and 1 x 32k (--clock-control none): duration against the
#           event-timed call, grid, waves, occupancy, DRAM throughput, PmSampling (over time) if present
# DEC_STEPS (default "build bench test ncu"); OUT: log folder (summary.txt is written as it goes, at most 8
# files come back); DEC_NCU_MAX (default 150): the ncu step is skipped past this many seconds.
# Wall time on an H200 (2026-11-28): build 84 s (new 49, base 35), a bench round (base + new) ~30 s, the tests up
# to ~130 s (test_cuda_plan_update); DEC_STEPS="build bench" takes ~150 s.
set -uo pipefail
out=${OUT:-dec_out}; mkdir -p "$out"
steps=" ${DEC_STEPS:-build bench test ncu} "
has() { [[ "$steps" == *" $1 "* ]]; }
BT=$(cd "$1" && pwd); NT=$(cd "$2" && pwd)
W=/tmp/dec40_w; BIN=/tmp/dec40_bin; L=/tmp/dec40_l; mkdir -p $BIN/base $BIN/new $L
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
log() { tee -a "$out/summary.txt"; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader | sed 's/^/# gpu: /' | log
TESTS="test_cuda_attn test_cuda_quant_attn test_cuda_dcp test_cuda_graph test_cuda_plan_update"
BENCH="bench_cuda kvattn_cli"
run_tests() {
  local pids=()
  ( KVA_TEST_ONLY=test_grid,test_split_kv,test_many_items,test_decode_mma,test_mma_mixed,test_dcp_plans,test_empty_rows,test_stale_plan,test_force_kernel \
      KVA_TEST_QUICK=1 timeout ${DEC_TEST_TIMEOUT:-170} $BIN/new/test_cuda_attn >$L/t_attn.log 2>&1
    echo "test_cuda_attn (decode cases, quick) rc=$?: $(grep -aE 'passed|FAILED|CHECK failed' $L/t_attn.log | tail -1 | cut -c1-120)" ) &
  pids+=($!)
  for t in test_cuda_quant_attn test_cuda_dcp test_cuda_graph test_cuda_plan_update; do
    ( KVA_TEST_QUICK=1 timeout ${DEC_TEST_TIMEOUT:-170} $BIN/new/$t >$L/t_$t.log 2>&1
      echo "$t (quick) rc=$?: $(grep -aE 'passed|FAILED|CHECK failed' $L/t_$t.log | tail -1 | cut -c1-120)" ) &
    pids+=($!)
  done
  ( KVA_TEST_ONLY=test_split_kv,test_many_items KVA_TEST_QUICK=1 timeout ${DEC_TEST_TIMEOUT:-170} compute-sanitizer --tool memcheck \
      --error-exitcode 9 $BIN/new/test_cuda_attn >$L/mc.log 2>&1
    echo "memcheck test_cuda_attn test_split_kv,test_many_items (quick) rc=$?: $(grep -a 'ERROR SUMMARY' $L/mc.log | tail -1)" ) &
  pids+=($!)
  for p in "${pids[@]}"; do wait $p; done
}
if has build; then
  rm -rf $W; cp -r "$NT" $W
  cmake -S $W -B $W/build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DKVA_BUILD_TESTS=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF -DKVA_WITH_CJSON=OFF \
    -DKVA_WITH_MPI=OFF -DKVA_WITH_NCCL=OFF >$L/cmake.log 2>&1 || { tail -20 $L/cmake.log | log; exit 1; }
  ninja -C $W/build -j16 $BENCH $TESTS >$L/build_new.log 2>&1 || { grep -a -m20 -A3 error $L/build_new.log | log; exit 1; }
  cp $W/build/bench_cuda $W/build/kvattn $BIN/new/; for t in $TESTS; do cp $W/build/$t $BIN/new/; done
  el "build new" | log
  (cd "$BT" && find . -type f ! -path './build*' ! -path './.git/*') | while read -r f; do
    cmp -s "$BT/$f" "$W/$f" || { mkdir -p "$(dirname "$W/$f")"; cp "$BT/$f" "$W/$f"; echo "$f"; }
  done >$L/changed.txt
  ninja -C $W/build -j16 $BENCH >$L/build_base.log 2>&1 || { grep -a -m20 -A3 error $L/build_base.log | log; exit 1; }
  cp $W/build/bench_cuda $W/build/kvattn $BIN/base/
  el "build base (over new's tree: $(tr '\n' ' ' <$L/changed.txt | cut -c1-300))" | log
fi
D="--mode decode --heads 32 --kv-heads 8 --head-dim 128 --iters 20"
S=("16x1k|--batch 16 --context 1023" "16x4k|--batch 16 --context 4095" "64x4k|--batch 64 --context 4095"
   "1x128k|--batch 1 --context 131071" "1x32k|--batch 1 --context 32767"
   "64x4k-int8|--batch 64 --context 4095 --quant int8" "64x4k-fp8|--batch 64 --context 4095 --quant fp8")
copies() { # the same-bytes copies (read + write = the rows' KV bytes), MiB
  for m in 32 64 128 256 512; do # copy-bytes: the KV bytes of 16 x 1k, 1 x 32k, 16 x 4k, 1 x 128k, 64 x 4k
    l=$($BIN/base/bench_cuda --mode copy --copy-bytes $((m << 20)) --iters 30 2>&1 | grep -a "^bench_cuda" | head -1)
    echo "copy$1 ${m}MiB $l" >>$out/raw.txt
    echo "copy$1 ${m}MiB (KV $((2 * m)) MiB) $(echo "$l" | grep -oE 'median [0-9.]+ ms, [0-9.]+ TB/s|back to back [0-9.]+ ms' | tr '\n' ' ')" | log
  done
}
if has bench; then
  rm -f $L/ms.txt
  copies 1
  for r in $(seq 1 ${DEC_ROUNDS:-2}); do for t in base new; do
    for s in "${S[@]}"; do
      lab=${s%%|*}; a=${s#*|}
      l=$(timeout 60 $BIN/$t/bench_cuda $D $a 2>&1 >/dev/null | grep -a "^bench_cuda:" | head -1)
      echo "r$r-$t $lab $l" >>$out/raw.txt
      ms=$(echo "$l" | grep -oE 'median [0-9.]+ ms' | awk '{print $2}'); bb=$(echo "$l" | grep -oE 'back to back [0-9.]+' | awk '{print $4}')
      echo "r$r $t $lab ${ms:-NA} ${bb:-NA} $(echo "$l" | grep -oE 'check [a-z]+' | awk '{print $2}')" >>$L/ms.txt
    done
    for n in 4 2; do
      timeout 60 $BIN/$t/kvattn bench --backend cuda --dcp $n --batch 1 --seq-len 131072 --iters 20 >$L/dcp.txt 2>&1
      echo "r$r-$t dcp$n rc=$?" >>$out/raw.txt; sed "s/^/r$r-$t dcp$n /" $L/dcp.txt >>$out/raw.txt
      echo "r$r $t dcp$n $(grep -a 'slowest rank' $L/dcp.txt | awk '{print $NF}') $(grep -aE '^ *unsharded ' $L/dcp.txt | awk '{print $2}')" >>$L/ms.txt
    done
  done; el "bench round $r" | log; done
  copies 2
  python3 - $L/ms.txt <<'EOF' | log
import sys
d = {}
for l in open(sys.argv[1]):
    f = l.split()
    d[(f[2], f[1], int(f[0][1:]))] = f[3:]
labs = list(dict.fromkeys(k[0] for k in d))
rs = sorted({k[2] for k in d})
print('per call median ms (back to back) by round; dcp: slowest rank / unsharded (unsharded ms)')
for lab in labs:
    for t in ('base', 'new'):
        v = [d.get((lab, t, r)) for r in rs]
        if lab.startswith('dcp'):
            s = '  '.join(f'{x[0]} ({x[1]})' if x else '-' for x in v)
        else:
            s = '  '.join(f'{x[0]} ({x[1]}) {x[2] if len(x) > 2 else ""}' if x else '-' for x in v)
        print(f'{lab:11} {t:5} {s}')
EOF
fi
if has test; then run_tests 2>&1 | log; el "tests done" | log; fi
if has ncu && command -v ncu >/dev/null && [ $(( $(date +%s) - t0 )) -lt ${DEC_NCU_MAX:-150} ]; then
  sec="--section SpeedOfLight --section LaunchStats --section Occupancy"
  ncu --list-sections 2>/dev/null | grep -q PmSampling && sec="$sec --section PmSampling"
  for s in "16x4k|--batch 16 --context 4095" "1x32k|--batch 1 --context 32767"; do
    lab=${s%%|*}; a=${s#*|}
    timeout 40 ncu --clock-control none -k regex:decode_mma --launch-skip 4 --launch-count 1 $sec \
      $BIN/new/bench_cuda $D $a --iters 5 >$L/ncu_$lab.txt 2>&1
    echo "== ncu new $lab rc=$?" >>$out/ncu.txt; cat $L/ncu_$lab.txt >>$out/ncu.txt
    el "ncu $lab: $(grep -aE '^ +(Duration|DRAM Throughput|Grid Size|Waves Per SM|Achieved Occupancy|Registers Per Thread|Memory Throughput) ' $L/ncu_$lab.txt | awk '{printf "%s %s %s; ", $1, $2, $NF}')" | log
  done
fi
tar -czf $out/logs.tgz -C $L . 2>/dev/null
el "done" | log
