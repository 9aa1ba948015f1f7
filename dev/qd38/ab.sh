#!/usr/bin/env bash
# dev/qd38/ab.sh BASE TREE... - issue 23's quantized decode on one GPU, in one call (dev/qd28/ab.sh
# plus the `inst` step and test_cuda_quant left out of the build). BASE and
# each TREE are source trees (e.g. `git archive` of main and of a branch); the last TREE is
# "new" (tests and sanitizer run on it).
#   build    builds BASE (90a, Release, no optional deps; bench_cuda, test_cuda_quant_attn,
#            test_cuda_quant), keeps its binaries, then per TREE copies its differing files over
#            the same build tree and rebuilds (only what changed recompiles; no file may be
#            added or removed)
#   ncu      Nsight Compute of BASE's (and the last TREE's) 64 x 4k decode kernels: int8_channel,
#            fp8_e4m3, bf16, D 64 int8 (sections of issue 23's profile, WarpStateStats with
#            SourceCounters for int8; per-instruction stall samples as CSV)
#   test     QD_TESTS (default test_cuda_quant_attn test_cuda_qmag) of the last TREE (quick sets)
#   memcheck compute-sanitizer memcheck of the last TREE's test_cuda_quant_attn (quick)
#   inst     Nsight Compute, one metric set per tree (warp instructions executed, duration) of
#            the 64 x 4k int8_channel and fp8 decode kernels: instructions per 32-key step
#            (64 requests x 8 kv heads x 4096 / 32 steps = 65536 warp steps)
#   bench    bench_cuda of every tree, alternated QD_ROUNDS times (default 2): 64 x 4k bf16,
#            int8_channel, int8_token_k, fp8_e4m3; 16 x 4k int8; D 64 int8; prints a table of
#            medians and the quantized / bf16 ratio of the same tree and round
# QD_STEPS (default "build test bench inst"), OUT: log folder (at most 8 files come back);
# QD_NEED_BASE=1: stop at once unless this machine kept BASE's binaries from an earlier call;
# QD_TMP: the folder of the work tree and binaries (default /tmp; two runs at once need two);
# QD_NCU_ARGS: extra ncu arguments of the ncu step (e.g. --clock-control none);
# QD_SKIP="tree:row ...": bench rows left out; QD_TARGETS: what to build (default bench_cuda and the tests).
set -uo pipefail
out=${OUT:-qd_out}; mkdir -p "$out"
steps=" ${QD_STEPS:-build test bench inst} "
has() { [[ "$steps" == *" $1 "* ]]; }
trees=(); for t in "$@"; do trees+=("$(cd "$t" && pwd)"); done
names=(); for t in "${trees[@]}"; do names+=("$(basename "$t")"); done
last=${names[${#names[@]}-1]}
W=${QD_TMP:-/tmp}/qd38_w; B=${QD_TMP:-/tmp}/qd38_bin
mkdir -p "${QD_TMP:-/tmp}"
T=${QD_TARGETS:-"bench_cuda test_cuda_quant_attn test_cuda_qmag"}
t0=$(date +%s)
el() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
log() { tee -a "$out/summary.txt"; }
status=0
if has build; then
  # A warm machine that built the same BASE in an earlier call keeps its binaries and build
  # tree (/tmp): then BASE is not rebuilt and the trees are copied over that build tree.
  sum=$(cd "${trees[0]}" && find . -type f ! -path './build*' | sort | xargs md5sum | md5sum | cut -c1-16)
  reuse=0; [ -x "$B/${names[0]}/bench_cuda" ] && [ -d "$W/build" ] && [ "$(cat "$B/base.sum" 2>/dev/null)" = "$sum" ] && reuse=1
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader | log
  nproc | sed 's/^/cores: /' | log
  if [ $reuse = 0 ] && [ -n "${QD_NEED_BASE:-}" ]; then
    el "no BASE binaries from an earlier call on this machine (QD_NEED_BASE): stop" | log; exit 3
  fi
  if [ $reuse = 0 ]; then
    rm -rf "$W" "$B"; mkdir -p "$B"; cp -r "${trees[0]}" "$W"
    cmake -S "$W" -B "$W/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90a -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF \
      -DKVA_WITH_CJSON=OFF -DKVA_WITH_MPI=OFF -DKVA_WITH_NCCL=OFF >/tmp/qd38_cmake.log 2>&1 ||
      { tail -20 /tmp/qd38_cmake.log; exit 1; }
  fi
  for i in "${!trees[@]}"; do
    n=${names[$i]}; s=$(date +%s)
    if [ "$i" = 0 ] && [ $reuse = 1 ]; then el "build ${names[0]}: kept from an earlier call (same tree)" | log; continue; fi
    if [ "$i" -gt 0 ]; then
      (cd "${trees[$i]}" && find . -type f ! -path './build*') | while read -r f; do
        cmp -s "${trees[$i]}/$f" "$W/$f" || { mkdir -p "$(dirname "$W/$f")"; cp "${trees[$i]}/$f" "$W/$f"; echo "$f"; }
      done >/tmp/qd38_changed_$n.txt
    fi
    ninja -C "$W/build" -j16 $T >/tmp/qd38_build_$n.log 2>&1 || { tail -40 /tmp/qd38_build_$n.log; exit 1; }
    mkdir -p "$B/$n"; for t in $T; do cp "$W/build/$t" "$B/$n/"; done
    [ "$i" = 0 ] && echo "$sum" >"$B/base.sum"
    el "build $n: $(( $(date +%s) - s )) s $( [ "$i" -gt 0 ] && echo "(changed: $(tr '\n' ' ' </tmp/qd38_changed_$n.txt))")" | log
  done
fi
d="--mode decode --batch 64 --context 4095"
if has test; then
  for t in ${QD_TESTS:-test_cuda_quant_attn test_cuda_qmag}; do
    s=$(date +%s)
    KVA_TEST_QUICK=1 timeout 200 "$B/$last/$t" >/tmp/qd38_test_$t.log 2>&1; rc=$?
    [ $rc = 0 ] || status=1
    { echo "== $t"; cat /tmp/qd38_test_$t.log; } >>"$out/tests.log"
    el "test $t ($last, quick): rc=$rc in $(( $(date +%s) - s )) s; $(tail -1 /tmp/qd38_test_$t.log)" | log
    if [ $rc != 0 ] && [ "$last" != "${names[0]}" ]; then
      # the same test of BASE on this machine: does main fail it too?
      KVA_TEST_QUICK=1 timeout 200 "$B/${names[0]}/$t" >/tmp/qd38_test_base_$t.log 2>&1
      { echo "== $t (${names[0]})"; cat /tmp/qd38_test_base_$t.log; } >>"$out/tests.log"
      el "test $t (${names[0]}, quick): rc=$? ; $(tail -1 /tmp/qd38_test_base_$t.log)" | log
    fi
  done
fi
if has memcheck; then
  s=$(date +%s)
  KVA_TEST_QUICK=1 timeout ${QD_MEMCHECK_TIMEOUT:-150} compute-sanitizer --tool memcheck --error-exitcode 9 \
    "$B/$last/test_cuda_quant_attn" >/tmp/qd38_memcheck.log 2>&1; rc=$?
  [ $rc = 0 ] || status=1
  { echo "== memcheck test_cuda_quant_attn"; cat /tmp/qd38_memcheck.log; } >>"$out/tests.log"
  el "memcheck test_cuda_quant_attn ($last, quick): rc=$rc in $(( $(date +%s) - s )) s; $(grep 'ERROR SUMMARY' /tmp/qd38_memcheck.log | tail -1)" | log
fi
if has bench; then
  shapes=(
    "bf16|$d"
    "int8|$d --quant int8"
    "int8tok|$d --quant int8-token"
    "fp8|$d --quant fp8"
    "16x4k-int8|--mode decode --batch 16 --context 4095 --quant int8"
    "d64-int8|--mode decode --batch 64 --context 4095 --head-dim 64 --quant int8"
  )
  rm -f /tmp/qd38_ms.txt
  "$B/${names[0]}/bench_cuda" --mode copy --iters 20 2>&1 | grep "^bench_cuda" | log
  for r in $(seq 1 ${QD_ROUNDS:-2}); do
    for n in "${names[@]}"; do
      for sh in "${shapes[@]}"; do
        l=${sh%%|*}; a=${sh#*|}
        case " ${QD_SKIP:-} " in *" $n:$l "*) continue ;; esac
        line=$("$B/$n/bench_cuda" $a --iters 30 2>&1 >/dev/null | grep "^bench_cuda:" | head -1)
        echo "$n r$r $l $line" >>"$out/bench_raw.log"
        ms=$(echo "$line" | grep -oE 'median [0-9.]+ ms' | head -1 | awk '{print $2}')
        bb=$(echo "$line" | grep -oE 'back to back [0-9.]+' | awk '{print $4}')
        ck=$(echo "$line" | grep -oE 'check [a-zA-Z]+' | awk '{print $2}')
        echo "$n $r $l ${ms:-NA} ${bb:-NA} ${ck:-NA}" >>/tmp/qd38_ms.txt
      done
    done
    el "bench round $r done"
  done
  python3 - /tmp/qd38_ms.txt "${names[@]}" <<'EOF' | log
import sys, collections
rows = [l.split() for l in open(sys.argv[1])]
names = sys.argv[2:]
d = {(n, int(r), l): (float(ms) if ms != 'NA' else float('nan'), float(bb) if bb != 'NA' else float('nan'), ck)
     for n, r, l, ms, bb, ck in rows}
rounds = sorted({int(r) for _, r, *_ in rows})
labels = list(dict.fromkeys(l for _, _, l, *_ in rows))
print('per call median ms (b2b ms) by round; ratio = quantized / bf16 of the same tree and round')
for l in labels:
    for n in names:
        v = [d.get((n, r, l)) for r in rounds]
        if not any(v): continue
        s = '  '.join(f'{x[0]:.4f} ({x[1]:.4f}) {x[2]}' if x else '-' for x in v)
        rat = ''
        if l in ('int8', 'int8tok', 'fp8'):
            bf = lambda r: d.get((n, r, 'bf16'), d.get((names[0], r, 'bf16')))
            rs = [d[(n, r, l)][0] / bf(r)[0] for r in rounds if (n, r, l) in d and bf(r)]
            if rs: rat = 'ratio ' + ' / '.join(f'{x:.3f}' for x in rs)
        print(f'{l:11} {n:6} {s}  {rat}')
EOF
fi
if has inst && command -v ncu >/dev/null; then
  for n in "${names[@]}"; do
    for sh in "int8|--quant int8" "fp8|--quant fp8"; do
      l=${sh%%|*}; a=${sh#*|}
      timeout 60 ncu --print-units base -k regex:decode_mma --launch-skip 2 --launch-count 1 \
        --metrics smsp__inst_executed.sum,gpu__time_duration.sum,sm__warps_active.avg.pct_of_peak_sustained_active \
        "$B/$n/bench_cuda" $d $a --iters 3 >/tmp/qd38_inst_${n}_$l.txt 2>&1
      { echo "== inst $n $l"; grep -E "inst_executed|time_duration|warps_active|decode_mma" /tmp/qd38_inst_${n}_$l.txt; } >>"$out/ncu_inst.txt"
      ins=$(grep -E "smsp__inst_executed.sum" /tmp/qd38_inst_${n}_$l.txt | awk '{print $NF}' | tr -d ',')
      per=$(awk -v x="${ins:-0}" 'BEGIN { printf "%.1f", x / 65536 }')
      el "inst $n $l: ${ins:-NA} warp instructions ($per per 32-key step); $(grep -E 'gpu__time_duration.sum' /tmp/qd38_inst_${n}_$l.txt | awk '{print $(NF-1), $NF}')" | log
    done
  done
fi
if has ncu && command -v ncu >/dev/null; then
  sec="--section SpeedOfLight --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis --section InstructionStats"
  mkdir -p /tmp/qd38_ncu
  prof() { # tree label args...
    local n=$1 l=$2; shift 2
    local src=""; [ "$l" = int8 ] && src="--section SourceCounters --export /tmp/qd38_ncu/${n}_$l"
    timeout 90 ncu ${QD_NCU_ARGS:-} -k regex:decode_mma --launch-skip 2 --launch-count 1 $sec $src \
      "$B/$n/bench_cuda" "$@" --iters 3 >/tmp/qd38_ncu/${n}_$l.txt 2>&1
    echo "== $n $l: $*" >>"$out/ncu.txt"; cat /tmp/qd38_ncu/${n}_$l.txt >>"$out/ncu.txt"
    if [ -n "$src" ]; then
      ncu -i /tmp/qd38_ncu/${n}_$l.ncu-rep --page source --csv --print-source sass \
        >/tmp/qd38_ncu/${n}_${l}_sass.csv 2>&1
    fi
    el "ncu $n $l: $(grep -E ' Duration|DRAM Throughput|Issue Slots Busy|Achieved Occupancy' /tmp/qd38_ncu/${n}_$l.txt | awk '{print $1,$2,$(NF)}' | tr '\n' ' ')"
  }
  for n in ${QD_NCU_TREES:-${names[0]}}; do
    prof $n int8 $d --quant int8
    [ -n "${QD_NCU_INT8_ONLY:-}" ] && continue
    prof $n fp8 $d --quant fp8
    prof $n bf16 $d
    [ -n "${QD_NCU_D64:-}" ] && prof $n d64 --mode decode --batch 64 --context 4095 --head-dim 64 --quant int8
  done
  tar -czf "$out/ncu_src.tgz" -C /tmp/qd38_ncu . 2>/dev/null
fi
el "done"
exit $status
