#!/usr/bin/env bash
# dev/pf40/ab.sh BASE [B] NEW - issue 23 (pf40): the wgmma prefill's epilogue staged through shared
# memory (O written by stmatrix into the finished CTA tile's own Q rows, read back by whole rows,
# 16-byte stores of whole rows; the next Q load after the read-back), two or three trees in one
# device call, rerunnable by the lead on any GPU. Call 1 (2026-11-28): BASE = main, B = NEW with
# wg_dims::HDR_EARLY false at every head size (the next tile's header built after the read-back,
# not before the epilogue), NEW = branch pf40-staged (the measured kernel; branch pf40's kernel is
# main's again, since the staged epilogue lost: bench/results/h200_2026-11-28_pf40.txt).
# The trees must differ only in the wgmma prefill (src/attn/cuda/prefill_wgmma*): NEW is built
# whole; BASE's and B's prefill_wgmma objects are compiled from their own sources with NEW's
# compile lines and replace NEW's in a copy of the archive, so the call builds the library once
# (templates: dev/pf39/ab.sh on branch pf39, dev/pf38/ab.sh).
#   build  NEW (bench_cuda, test_cuda_prefill_mma, test_cuda_graph) with every core; BASE's and B's
#          six prefill objects and pf_trace of each tree beside it
#   tests  test_cuda_prefill_mma, test_cuda_graph (KVA_TEST_QUICK=1), in parallel, while the other
#          trees link; with MEMCHECK=1, memcheck of test_cuda_prefill_mma (quick, the TMA kernel:
#          the library's default) after every other step, in the time left before LIMIT s
#   bench  issue 23's prefill rows (bench_cuda --mode prefill: per call median, back to back,
#          check against the CPU backend), trees alternated, ROUNDS rounds; table.txt at the end
#   sdpa   torch SDPA flash / cuDNN on the short shapes (bench/prefill_sdpa_peer.py short)
#   trace  pf_trace 32 x 256 narrow per tree (PF_SCHED=1: the dynamic schedule, main's default)
# Environment: OUT (logs; at most ~8 files come back), STEPS (default "build tests bench sdpa
# trace"), ROUNDS (default 2), MEMCHECK=1 to add memcheck, LIMIT (default 165: the call's seconds).
set -u -o pipefail
OUT=${OUT:-pf40_ab}; mkdir -p "$OUT"
here=$(cd "$(dirname "$0")/../.." && pwd)
base=$(cd "$1" && pwd); new=$(cd "${!#}" && pwd); tb=""; trees="base new"; others=("$base")
[ $# -ge 3 ] && { tb=$(cd "$2" && pwd); trees="base b new"; others=("$base" "$tb"); }
steps=" ${STEPS:-build tests bench sdpa trace} "
for t in "${others[@]}"; do # the objects of NEW outside prefill_wgmma* are linked into every tree
    d=$(diff -rq "$t/src" "$new/src" | grep -v "/prefill_wgmma" || true)
    [ -n "$d" ] && echo "WARNING: $(basename $t) differs from NEW outside prefill_wgmma*: $d"
done
has() { [[ "$steps" == *" $1 "* ]]; }
L=/tmp/pf40_logs; mkdir -p $L
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
CM=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a
    -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF -DKVA_WITH_CJSON=OFF -DKVA_WITH_MPI=OFF
    -DKVA_WITH_NCCL=OFF -DKVA_BUILD_TESTS=ON)
NB=$new/b
SECONDS=0
objs="prefill_wgmma prefill_wgmma_d64 prefill_wgmma_d128 prefill_wgmma_d128n prefill_wgmma_d192 prefill_wgmma_d256"
trace_build() { # tree: pf_trace's object (linked to the tree's archive later)
    nvcc -O3 -std=c++17 -arch=sm_90a -DKVA_CUDA_SM90A=1 -DKVA_HAVE_CUDA=1 -diag-suppress 177 \
        -I"$1/src/attn/cuda" -I"$1/include" -I"$1/src/core" -I"$1/src/plan" \
        -c "$here/dev/pf_trace/pf_trace.cu" -o "$1/lib/pf_trace.o"
}
bp=() # the background builds
if has build; then
    cmake -S "$new" -B "$NB" "${CM[@]}" > $L/cmake.log 2>&1 || { tail -20 $L/cmake.log; exit 1; }
    # BASE's and B's prefill objects (and every tree's pf_trace) beside NEW's build.
    for t in "${others[@]}"; do
        mkdir -p "$t/lib"
        for f in $objs; do
            o=CMakeFiles/kvattn_obj.dir/src/attn/cuda/$f.cu.o
            cmd=$(ninja -C "$NB" -t commands "$o" | tail -1 |
                sed "s#$new/#$t/#g; s# -o $o# -o $t/lib/$f.cu.o#; s# -MD -MT [^ ]* -MF [^ ]*##")
            (cd "$NB" && bash -c "$cmd -Xptxas -v") > "$L/obj_$(basename $t)_$f.log" 2>&1 &
            bp+=($!)
        done
    done
    for t in "${others[@]}" "$new"; do
        mkdir -p "$t/lib"; trace_build "$t" > "$L/trace_build_$(basename $t).log" 2>&1 & bp+=($!)
    done
    ninja -C "$NB" -j16 kvattn_static bench_cuda test_cuda_prefill_mma test_cuda_graph > $L/build_new.log 2>&1 ||
        { grep -m20 -E "error|FAILED" $L/build_new.log; echo "BUILD FAILED new"; exit 1; }
    echo "new built at $SECONDS s"
fi
tests_pid=""
if has tests; then
    (
        ( KVA_TEST_QUICK=1 timeout 150 "$NB/test_cuda_prefill_mma" > "$L/test_prefill.log" 2>&1
          echo "test_cuda_prefill_mma quick: exit $? at $SECONDS s"; tail -n 3 "$L/test_prefill.log" ) &
        ( KVA_TEST_QUICK=1 timeout 150 "$NB/test_cuda_graph" > "$L/test_graph.log" 2>&1
          echo "test_cuda_graph quick: exit $? at $SECONDS s"; tail -n 3 "$L/test_graph.log" ) &
        wait
    ) > "$OUT/tests.txt" 2>&1 &
    tests_pid=$!
fi
if has build; then
    wait "${bp[@]}"
    link=$(ninja -C "$NB" -t commands bench_cuda | tail -1)
    for t in "${others[@]}"; do
        cp "$NB/libkvattn.a" "$t/lib/libkvattn.a"
        ar r "$t/lib/libkvattn.a" $(for f in $objs; do echo "$t/lib/$f.cu.o"; done) || echo "AR FAILED $t"
        (cd "$NB" && bash -c "$(echo "$link" | sed "s# libkvattn.a # $t/lib/libkvattn.a #; s#-o bench_cuda#-o $t/lib/bench_cuda#")") \
            > "$L/link_$(basename $t).log" 2>&1 || echo "LINK FAILED $t"
    done
    cp "$NB/bench_cuda" "$NB/libkvattn.a" "$new/lib/"
    for t in "${others[@]}" "$new"; do
        nvcc -arch=sm_90a "$t/lib/pf_trace.o" "$t/lib/libkvattn.a" -lgomp -lpthread -lm -o "$t/lib/pf_trace" \
            >> "$L/trace_build_$(basename $t).log" 2>&1 || echo "pf_trace not built for $(basename $t)"
    done
    echo "archive members: $(ar t "$base/lib/libkvattn.a" | grep -c prefill_wgmma) prefill_wgmma objects (base copy), $(ar t "$NB/libkvattn.a" | grep -c prefill_wgmma) (new)"
    echo "base/b ptxas spill stores (bytes, per instantiation): $(cat $L/obj_*_prefill_wgmma_d*.log | grep -oE '[0-9]+ bytes spill stores' | awk '{printf "%s ", $1}')"
    echo "all built at $SECONDS s"
fi
[ -n "$tests_pid" ] && { wait "$tests_pid"; cat "$OUT/tests.txt"; echo "tests done at $SECONDS s"; }
if grep -q "exit 124" "$OUT/tests.txt" 2>/dev/null; then # a hung kernel: time no tree
    echo "a test timed out: no bench"; steps=" "
fi
if has bench; then
    shapes=("32 256 0 128" "8 1024 0 128" "2 2048 0 128" "1 4096 0 128" "4 1024 3072 128"
            "1 4096 0 64" "1 4096 0 256")
    for round in $(seq 1 "${ROUNDS:-2}"); do
        order=$trees; [ $((round % 2)) = 0 ] && order=$(echo $trees | tr ' ' '\n' | tac | tr '\n' ' ')
        for s in "${shapes[@]}"; do
            read -r R Q C D <<< "$s"
            for t in $order; do
                d=$base; [ $t = b ] && d=$tb; [ $t = new ] && d=$new
                line=$(timeout 60 "$d/lib/bench_cuda" --mode prefill --batch "$R" --q-len "$Q" --context "$C" \
                    --head-dim "$D" --iters 30 2>&1 >/dev/null | grep "^bench_cuda:" | head -1)
                echo "$t $line" >> "$L/bench_raw.log"
                echo "r$round $t ${R}x${Q}+${C} D$D $(echo "$line" | grep -oE 'median [0-9.]+ ms|check [a-zA-Z]+|back to back [0-9.]+ ms' | tr '\n' ' ')"
            done
        done
    done | tee "$OUT/bench.txt"
    echo "bench done at $SECONDS s"
fi
if has sdpa; then
    # as dev/final/run.sh: flashinfer kept out (no JIT on a bare machine)
    (cd "$here" && PYTHONUNBUFFERED=1 timeout 90 python3 -u -c "import sys; sys.path.insert(0, 'bench'); sys.modules['flashinfer'] = None; sys.argv = ['p', 'short']; exec(open('bench/prefill_sdpa_peer.py').read())") 2>&1 |
        grep -E "cudnn|ceiling" | tee "$OUT/sdpa.txt"
    echo "sdpa done at $SECONDS s"
fi
if [ -s "$OUT/bench.txt" ]; then # the mean of the rounds per tree and shape, change against base
    python3 - "$OUT/bench.txt" "$OUT/sdpa.txt" <<'PY' | tee "$OUT/table.txt"
import re, sys, collections
v = collections.defaultdict(list)
for ln in open(sys.argv[1]):
    m = re.match(r"r\d+ (\w+) (\S+) (D\d+) .*median ([0-9.]+) ms.*back to back ([0-9.]+) ms", ln)
    if m: v[(m.group(2) + " " + m.group(3), m.group(1))].append((float(m.group(4)), float(m.group(5))))
peer = {}
try:
    for ln in open(sys.argv[2]):
        m = re.match(r"(\d+)x(\d+)(?:\+(\d+))? \S+ D128\s+sdpa-cudnn\s+([0-9.]+) ms.*b2b\s+([0-9.]+) ms", ln)
        if m: peer["%sx%s+%s D128" % (m.group(1), m.group(2), m.group(3) or "0")] = (float(m.group(4)), float(m.group(5)))
except OSError: pass
shapes = sorted({k[0] for k in v}, key=lambda x: list(v).index((x, "base")) if (x, "base") in v else 0)
trees = [t for t in ("base", "b", "new") if any(k[1] == t for k in v)]
print("shape | " + " | ".join("%s per call / b2b ms" % t for t in trees) + " | change vs base | cuDNN ratio (new)")
for sh in shapes:
    cells, mean = [], {}
    for t in trees:
        x = v.get((sh, t), [])
        if not x: cells.append("-"); continue
        mean[t] = (sum(a for a, _ in x) / len(x), sum(b for _, b in x) / len(x))
        cells.append("%.4f / %.4f" % mean[t])
    ch = " ".join("%s %+.1f%% / %+.1f%%" % (t, 100 * (mean[t][0] / mean["base"][0] - 1), 100 * (mean[t][1] / mean["base"][1] - 1))
                  for t in trees if t != "base" and t in mean and "base" in mean)
    p = peer.get(sh)
    r = "%.2fx / %.2fx" % (p[0] / mean["new"][0], p[1] / mean["new"][1]) if p and "new" in mean else "-"
    print(sh + " | " + " | ".join(cells) + " | " + ch + " | " + r)
PY
fi
if has trace; then
    for t in $trees; do d=$base; [ $t = b ] && d=$tb; [ $t = new ] && d=$new
        [ -x "$d/lib/pf_trace" ] || continue
        ps=1
        echo "== $t (PF_SCHED=$ps) 32 256 0 1"; PF_SCHED=$ps timeout 30 "$d/lib/pf_trace" 32 256 0 1 2>&1
    done > "$OUT/trace.txt" 2>&1
    grep -E "^==|library kernel|span|^  [1-8] |producer|lifetime" "$OUT/trace.txt" | head -60
    echo "trace done at $SECONDS s"
fi
if [ "${MEMCHECK:-0}" = 1 ]; then # last, in the time left before LIMIT (default 165 s)
    left=$(( ${LIMIT:-165} - SECONDS - 5 ))
    if [ $left -ge 20 ]; then
        KVA_TEST_QUICK=1 KVA_TEST_KERNELS=3 timeout $left compute-sanitizer --tool memcheck --error-exitcode 9 \
            "$NB/test_cuda_prefill_mma" > "$L/memcheck_prefill.log" 2>&1
        echo "memcheck test_cuda_prefill_mma quick (TMA kernel, ${left} s allowed): exit $? at $SECONDS s $(grep 'ERROR SUMMARY' "$L/memcheck_prefill.log" | tail -1)" | tee -a "$OUT/tests.txt"
    else
        echo "memcheck not run: ${left} s left" | tee -a "$OUT/tests.txt"
    fi
fi
(cd $L && tar czf "$OUT/logs.tgz" . 2>/dev/null)
echo "total $SECONDS s"
