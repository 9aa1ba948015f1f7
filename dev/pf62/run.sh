#!/usr/bin/env bash
# dev/pf62/run.sh - pf62's one H200 call (issue 23): the wgmma prefill as a programmatic dependent launch.
# Staged in .dev/pf62: ./new (git archive of branch pf62), ./base (git archive of main). Call:
#   run(command="bash .dev/pf62/new/dev/pf62/run.sh", carry=[".dev/pf62"], kind="nvidia-h200", timeout_s=230)
# Steps (log: $OUT/pf62.txt, the table printed last):
#   build   base and new in parallel (-j8 each): bench_cuda and the tests below; base gets new's bench/bench_cuda.c
#           (its "queued" line) so both trees are timed by the same harness; new also builds libkvattn.so
#   fault   new with kva__pdl_wait() removed from the kernel (the D 128 objects, prefill_wgmma_d128n and _d128, recompiled from a
#           patched copy of the source and swapped into a copy of new's libkvattn.a), test_cuda_prefill_chain
#           relinked against it: it must FAIL (the planted fault); runs beside new's tests
#   tests   new: test_cuda_prefill_chain, test_cuda_prefill_mma, test_cuda_graph, test_cuda_attn (quick) and
#           tests/python -k prefill on the CUDA build, in parallel; then the fault's test alone
#   bench   bench_cuda --mode prefill, causal bf16 H 32/8 D 128 B 16: 32x256, 8x1024, 1x4096, 4x1024 after 3072;
#           per call / back to back / queued (one run behind a memset) / graph per layer; round 1 base new,
#           round 2 new base
#   sdpa    torch SDPA (cuDNN backend) per call and back to back on the same shapes (bench/peer_timing.py)
# Knobs: LATE (s; a bench round not started by then is skipped, default 175; sdpa: LATE + 30), J (ninja jobs per tree, 8),
#   TESTS (new's tests besides test_cuda_prefill_chain; default "test_cuda_prefill_mma test_cuda_graph test_cuda_attn"),
#   PY=0 (no pytest), SHAPES ("R Q C;R Q C", default the four), ROUNDS (alternated A/B rounds, default 2), SDPA=0.
# The follow-up call (the rebuilt chain test and its planted fault, 4 rounds of the two shapes in question):
#   run(command="PY=0 SDPA=0 ROUNDS=4 TESTS=test_cuda_prefill_mma SHAPES='4 1024 3072;32 256 0' bash .dev/pf62/new/dev/pf62/run.sh",
#       carry=[".dev/pf62"], kind="nvidia-h200", timeout_s=200)
set -uo pipefail
st=$(cd "$(dirname "$0")/../../.." && pwd) # .dev/pf62
res=${OUT:-$st/out}; mkdir -p "$res"; L=$res/pf62.txt; tmp=/tmp/pf62_logs; mkdir -p "$tmp"
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; T() { echo "## $1: $(el) s" >>"$L"; }
late() { local lim=$(( ${LATE:-175} + ${2:-0} )); [ "$(el)" -le $lim ] || { echo "## $1 skipped: $(el) s > $lim" >>"$L"; return 1; }; }
echo "# pf62 call, $(date -u '+%F %T') UTC; gpu: $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>&1); $(nproc) cores" >>"$L"
cp "$st/new/bench/bench_cuda.c" "$st/base/bench/bench_cuda.c"
TESTS=${TESTS-test_cuda_prefill_mma test_cuda_graph test_cuda_attn}
for t in base new; do
  tg="bench_cuda"; [ $t = new ] && tg="$tg $TESTS test_cuda_prefill_chain libkvattn.so"
  ( cmake -S "$st/$t" -B /tmp/pf62_$t -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
      -DKVA_BUILD_TESTS=ON -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF -DKVA_WITH_CJSON=OFF -DKVA_WITH_MPI=OFF \
      -DKVA_WITH_NCCL=OFF >$tmp/cmake_$t.log 2>&1 &&
    timeout 150 ninja -C /tmp/pf62_$t -j"${J:-8}" $tg >$tmp/build_$t.log 2>&1
    echo "build $t ($tg) rc=$? at $(el) s" >>"$L" ) &
done
wait
BN=/tmp/pf62_new; BB=/tmp/pf62_base
if [ ! -x $BN/bench_cuda ] || [ ! -x $BB/bench_cuda ]; then
  grep -h -m10 -E "error|Error" $tmp/build_*.log $tmp/cmake_*.log | cut -c1-300 >>"$L"; tail -5 $tmp/build_*.log >>"$L"
  tar -czf "$res/logs.tgz" -C $tmp .; cat "$L"; exit 1
fi
T build
# The planted fault, built beside the tests: new's kernel without its griddepcontrol.wait.
( f=/tmp/pf62f; mkdir -p $f; cp -r "$st/new" $f/src
  n=$(grep -c '^    kva__pdl_wait();$' $f/src/src/attn/cuda/prefill_wgmma_kernel.cuh)
  sed -i 's|^    kva__pdl_wait();$|    /* planted fault (dev/pf62/run.sh): no wait */|' $f/src/src/attn/cuda/prefill_wgmma_kernel.cuh
  lk=$(ninja -C $BN -t commands test_cuda_prefill_chain | tail -1)
  lk=${lk/ libkvattn.a / $f\/libkvattn.a }; lk=${lk/-o test_cuda_prefill_chain /-o $f\/test_fault }
  cp $BN/libkvattn.a $f/
  for o in prefill_wgmma_d128n prefill_wgmma_d128; do
    obj=CMakeFiles/kvattn_obj.dir/src/attn/cuda/$o.cu.o
    cc=$(ninja -C $BN -t commands $obj | tail -1); cc=${cc//$st\/new\//$f\/src\/}; cc=${cc//$obj/$f\/$o.cu.o}
    (cd $BN && eval "$cc") &
  done
  wait; (cd $f && ar r libkvattn.a prefill_wgmma_d128n.cu.o prefill_wgmma_d128.cu.o) && (cd $BN && eval "$lk")
  echo "fault build rc=$? at $(el) s (waits removed: $n; archive members: $(ar t $f/libkvattn.a | grep -c "prefill_wgmma_d128n*\.cu"))"
) >$tmp/fault_build.log 2>&1 &
# new's tests and the Python prefill tests, in parallel (correctness only; the timings come later, alone).
for t in test_cuda_prefill_chain $TESTS; do
  ( KVA_TEST_QUICK=1 timeout 60 $BN/$t >$tmp/$t.log 2>&1
    echo "$t (quick) rc=$? at $(el) s: $(grep -aE 'passed|FAIL|mismatch' $tmp/$t.log | tail -3 | tr '\n' ' ' | cut -c1-300)" >>"$L" ) &
done
[ "${PY:-1}" = 1 ] && ( cd "$st/new/tests/python" && KVATTN_LIBRARY=$BN/libkvattn.so PYTHONPATH="$st/new/python" timeout 60 \
    python3 -m pytest -q -p no:cacheprovider -k prefill . >$tmp/pytest.log 2>&1
  echo "pytest tests/python -k prefill (CUDA build) rc=$? at $(el) s: $(tail -1 $tmp/pytest.log)" >>"$L"
  grep -E "^FAILED|^ERROR" $tmp/pytest.log | head -5 >>"$L" ) &
wait
T tests
tail -1 $tmp/fault_build.log >>"$L"
if [ -x /tmp/pf62f/test_fault ]; then
  timeout 30 /tmp/pf62f/test_fault >$tmp/fault_test.log 2>&1
  echo "planted fault (no kva__pdl_wait): test_cuda_prefill_chain rc=$? (must be non-zero): $(grep -aE 'differ|passed|FAIL' $tmp/fault_test.log | head -3 | tr '\n' ' ' | cut -c1-400)" >>"$L"
else grep -m5 -iE "error" $tmp/fault_build.log >>"$L"; fi
T fault
SH=("32 256 0" "8 1024 0" "1 4096 0" "4 1024 3072")
[ -n "${SHAPES:-}" ] && IFS=';' read -ra SH <<< "$SHAPES"
for r in $(seq 1 "${ROUNDS:-2}"); do
  late "bench round $r" || break
  order="base new"; [ $((r % 2)) = 0 ] && order="new base"
  for s in "${SH[@]}"; do set -- $s
    for t in $order; do
      x=$(timeout 40 /tmp/pf62_$t/bench_cuda --mode prefill --batch $1 --q-len $2 --context $3 --iters 50 \
        --graph-layers 8 2>&1 >$tmp/json_${t}_${r}_$1x$2.txt | grep -m1 '^bench_cuda:')
      echo "r$r $t ${1}x$2+$3: $(echo "$x" | grep -oE 'median [0-9.]+ ms|check [a-zA-Z]+|host enqueue median [0-9.]+ us|back to back [0-9.]+ ms|queued [0-9.]+ ms' | tr '\n' ' ')graph $(grep -o '"graph_ms_per_layer": [0-9.]*' $tmp/json_${t}_${r}_$1x$2.txt | cut -d' ' -f2) ms" >>"$L"
    done
  done
  T "bench round $r"
done
if [ "${SDPA:-1}" = 1 ] && late sdpa 30; then
  (cd "$st/new/bench" && PYTHONUNBUFFERED=1 timeout 45 python3 - >$tmp/sdpa.log 2>&1 <<'EOF'
import torch, torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right
from peer_timing import timed
for R, S, C in [(32, 256, 0), (8, 1024, 0), (1, 4096, 0), (4, 1024, 3072)]:
    H, D = 32, 128
    q = torch.randn(R, H, S, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(R, H, S + C, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(R, H, S + C, D, device="cuda", dtype=torch.bfloat16)
    bias = causal_lower_right(S, S + C) if C else None
    call = (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)) if not C else \
        (lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=bias))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        ms, b2b = timed(call)
    print(f"sdpa-cudnn {R}x{S}+{C}: per call {ms:.4f} ms b2b {b2b:.4f} ms")
EOF
  ); echo "sdpa rc=$?" >>"$L"; grep -aE "sdpa-cudnn|Error|error" $tmp/sdpa.log | head -6 >>"$L"; T sdpa
fi
# Table: means of the rounds (per call / back to back / queued, ms) and new's b2b vs cuDNN's.
python3 - "$L" >>"$L" <<'EOF'
import re, sys
rows, cud = {}, {}
for ln in open(sys.argv[1]):
    m = re.match(r"r\d (\w+) (\S+): median ([\d.]+) ms .*back to back ([\d.]+) ms queued ([\d.]+) ms", ln)
    if m:
        rows.setdefault((m[2], m[1]), []).append([float(x) for x in m.groups()[2:]])
    m = re.match(r"sdpa-cudnn (\S+): per call ([\d.]+) ms b2b ([\d.]+) ms", ln)
    if m:
        cud[m[1]] = (float(m[2]), float(m[3]))
print("shape        | base call/b2b/queued ms | new call/b2b/queued ms | new vs base (call, b2b, queued) | cuDNN call/b2b ms | cuDNN b2b / new b2b")
for shp in dict.fromkeys(k[0] for k in rows):
    mb = [sum(c) / len(c) for c in zip(*rows.get((shp, "base"), [[0, 0, 0]]))]
    mn = [sum(c) / len(c) for c in zip(*rows.get((shp, "new"), [[0, 0, 0]]))]
    ch = ", ".join(f"{(n / b - 1) * 100:+.1f}%" if b else "-" for b, n in zip(mb, mn))
    c = cud.get(shp)
    print(f"{shp:12s} | {mb[0]:.4f} / {mb[1]:.4f} / {mb[2]:.4f} | {mn[0]:.4f} / {mn[1]:.4f} / {mn[2]:.4f} | {ch} | "
          + (f"{c[0]:.4f} / {c[1]:.4f} | {c[1] / mn[1]:.2f}x" if c and mn[1] else "- | -"))
EOF
T end
tar -czf "$res/logs.tgz" -C $tmp .
cat "$L"
