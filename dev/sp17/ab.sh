#!/usr/bin/env bash
# dev/sp17/ab.sh - one device call for the sparse MLA decode at few heads on
# the mma.sync kernel (issue 17's "H 16 at least 2x the padded H 64"), after
# dev/sp16/ab.sh: main ("base") against this tree ("new": the transposed S of
# the 16-row fp8_ds_mla items) and, optionally, a third tree ("alt",
# KVA_ALT=DIR; src and include suffice). Builds this tree (kvattn,
# test_cuda_mla_sparse), compiles base's (and alt's) mla_sparse.cu with its
# own headers (the only object whose code differs: the dense
# mla_decode_mma*.cu objects of this branch equal main's, checked on the VM)
# and relinks kvattn and test_cuda_mla_sparse with it; then
#   1. smoke runs of every side (H 16, H 24, H 40 forced onto mma.sync, H 3,
#      H 16 in the separate mode; checked against the reference backend): a failure
#      or hang of new stops the call, of alt drops alt;
#   2. test_cuda_mla_sparse, all cases, on new and alt;
#   3. the rows below over fp8_ds_mla, the sides alternated twice (every run
#      checked against the reference backend): H 16 and H 32 (mma.sync),
#      H 64 = H 16 padded and H 128 (wgmma, controls), H 16 at 16 requests;
#   4. compute-sanitizer memcheck of test_cuda_mla_sparse quick on new, and
#      Nsight Compute of one H 16 launch per side named in KVA_NCU_SIDES
#      (default none), while the elapsed time allows (KVA_MC_BY, KVA_NCU_BY,
#      seconds);
# and prints a table last. Run from the parent of the trees:
#   OUT=$OUT bash new/dev/sp17/ab.sh base new          (KVA_ALT=alt for a third)
# The GPU named is the first of CUDA_VISIBLE_DEVICES (or GPU 0).
set -u
base=$(cd "$1" && pwd) new=$(cd "$2" && pwd)
alt=${KVA_ALT:+$(cd "$KVA_ALT" && pwd)}
o=${OUT:-/tmp/out}
l=/tmp/sp17l
mkdir -p "$o" "$l"
t0=$(date +%s)
el() { echo $(($(date +%s) - t0)); }
log() { echo "$*" | tee -a "$o/run.txt"; }
pack() { tar -czf "$o/logs.tgz" -C "$l" . 2>/dev/null; }
gpu=$(nvidia-smi ${CUDA_VISIBLE_DEVICES:+-i ${CUDA_VISIBLE_DEVICES%%,*}} \
  --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | head -1)
log "== GPU: $gpu"
cd "$new"
cmake -S . -B bd -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF -DKVA_WITH_CJSON=OFF -DKVA_WITH_MPI=OFF \
  -DKVA_WITH_NCCL=OFF >"$l/cfg.log" 2>&1 || { log "CONFIGURE FAILED"; tail "$l/cfg.log"; pack; exit 1; }
mkdir -p bo/base bo/alt b
sides="base new"; [ -n "$alt" ] && sides="base new alt"
cc() { # cc TREE OUTDIR: TREE's mla_sparse.cu with TREE's headers
  nvcc -DKVA_CUDA_SM90A=1 -DKVA_HAVE_CUDA=1 -DKVA_VERSION_STRING=\"0.1.0\" -I"$1/include" \
    -I"$1/src/core" -I"$1/src/plan" -O3 -DNDEBUG \
    --generate-code=arch=compute_90a,code=[compute_90a,sm_90a] -Xcompiler=-fPIC \
    -Xcompiler=-fvisibility=hidden -std=c++17 -x cu -c "$1/src/attn/cuda/mla_sparse.cu" \
    -o "$2/mla_sparse.cu.o"
}
(cc "$base" bo/base >"$l/cc_base.log" 2>&1) &
[ -n "$alt" ] && (cc "$alt" bo/alt >"$l/cc_alt.log" 2>&1) &
timeout 300 ninja -C bd -j"$(nproc)" kvattn_cli test_cuda_mla_sparse >"$l/build.log" 2>&1 ||
  { log "BUILD FAILED"; grep -E "error" "$l/build.log" | head -20 | tee -a "$o/run.txt"; pack; exit 1; }
wait
log "== built $(el) s"
cp bd/kvattn bd/test_cuda_mla_sparse b/
relink() { # relink SIDE TARGET BINARY
  local cmd
  cmd=$(cd bd && ninja -t commands "$2" | tail -1)
  cmd=${cmd//libkvattn.a/..\/bo\/$1\/libkvattn_$1.a}
  cmd=$(echo "$cmd" | sed -E "s# -o $3( |\$)# -o ../b/$3_$1 #")
  (cd bd && eval "$cmd") >"$l/link_$1_$3.log" 2>&1 || { log "$1 $3 link failed"; head -c 600 "$l/link_$1_$3.log"; }
}
for v in base ${alt:+alt}; do
  cp bd/libkvattn.a bo/$v/libkvattn_$v.a && (cd bo/$v && ar r libkvattn_$v.a mla_sparse.cu.o) ||
    log "$v archive failed"
  relink $v kvattn_cli kvattn
  relink $v test_cuda_mla_sparse test_cuda_mla_sparse
done
ls b | tr '\n' ' ' | tee -a "$o/run.txt"; echo | tee -a "$o/run.txt"
MMA=mla_decode_mma_sm80
SM=("--iters 2 --batch 8 --q-len 2 --context 3000 --heads 16 --topk 512"
  "--iters 2 --batch 4 --q-len 3 --context 700 --heads 24 --topk 160"
  "--iters 2 --batch 3 --q-len 2 --context 900 --heads 40 --topk 300 --variant $MMA"
  "--iters 2 --batch 5 --q-len 1 --context 2000 --heads 3 --topk 700"
  "--iters 2 --batch 6 --q-len 2 --context 1500 --heads 16 --topk 333 --mode separate")
for v in new base ${alt:+alt}; do
  s=""; [ $v != new ] && s=_$v
  for i in 0 1 2 3 4; do
    timeout 40 b/kvattn$s bench --mla-sparse --backend cuda ${SM[$i]} >"$l/smoke_$v$i.log" 2>&1
    rc=$?
    log "smoke$i $v rc=$rc: $(grep -E ' ms ' "$l/smoke_$v$i.log" | tail -1 | tr -s ' ')"
    [ $rc = 0 ] && grep -q "check ok" "$l/smoke_$v$i.log" || { # new fails: stop; alt: dropped
      tail -5 "$l/smoke_$v$i.log" | tee -a "$o/run.txt"
      case $v in new) pack; exit 1 ;; alt) sides="base new" ;; esac
      break
    }
  done
done
# KVA_QUICK=1: the quick test set, and only the H 16 rows (a short second call).
env ${KVA_QUICK:+KVA_TEST_QUICK=1} timeout 120 b/test_cuda_mla_sparse >"$l/test_sparse.log" 2>&1
trc=$?
tset=all; [ -n "${KVA_QUICK:-}" ] && tset=quick
log "test_cuda_mla_sparse new ($tset) rc=$trc: $(grep -E 'passed|FAILED|failed' "$l/test_sparse.log" | tail -1 | cut -c1-140)"
[ $trc = 124 ] && { log "test_cuda_mla_sparse timed out (a hang?): new left out of the bench"; sides=${sides/new/}; }
grep -hE "FAILED|CHECK failed|bad" "$l/test_sparse.log" | head -10 | tee -a "$o/run.txt"
case " $sides " in *" alt "*)
  timeout 60 b/test_cuda_mla_sparse_alt >"$l/test_sparse_alt.log" 2>&1
  log "test_cuda_mla_sparse alt (all) rc=$?: $(grep -E 'passed|FAILED|failed' "$l/test_sparse_alt.log" | tail -1 | cut -c1-140)" ;;
esac
log "== tests $(el) s"
pack
D="--batch 128 --q-len 2 --context 8192 --topk 2048"
ROWS=("decode H16|$D --heads 16" "decode H64 (H16 padded)|$D --heads 64"
  "decode H32|$D --heads 32" "decode H128|$D --heads 128"
  "decode H16 R16|--batch 16 --q-len 2 --context 8192 --topk 2048 --heads 16")
[ -n "${KVA_QUICK:-}" ] && ROWS=("${ROWS[0]}" "${ROWS[4]}")
for r in 1 2; do
  order=$sides; [ $r = 2 ] && order=$(echo $sides | tr " " "\n" | tac | tr "\n" " ")
  for v in $order; do
    s=""; [ $v != new ] && s=_$v
    for m in "${ROWS[@]}"; do
      x=$(timeout 40 b/kvattn$s bench --mla-sparse --backend cuda --iters 20 ${m#*|} 2>&1 | grep -E ' ms ' | tail -1 | tr -s ' ')
      log "r$r $v ${m%%|*}: $x"
    done
  done
  log "== bench round $r $(el) s"
done
newok=0; case " $sides " in *" new "*) newok=1 ;; esac
if [ $newok = 1 ] && [ "$(el)" -lt "${KVA_MC_BY:-110}" ]; then
  KVA_TEST_QUICK=1 timeout 60 compute-sanitizer --tool memcheck b/test_cuda_mla_sparse >"$l/memcheck.log" 2>&1
  log "memcheck test_cuda_mla_sparse quick rc=$?: $(grep -E 'ERROR SUMMARY' "$l/memcheck.log" | tail -1)"
else
  log "memcheck skipped (time)"
fi
pack
for v in ${KVA_NCU_SIDES:-}; do
  [ "$(el)" -lt "${KVA_NCU_BY:-160}" ] || { log "ncu $v skipped (time)"; continue; }
  s=""; [ $v != new ] && s=_$v
  timeout 30 ncu --clock-control none --section SpeedOfLight --section WarpStateStats \
    --section Occupancy \
    --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum' \
    -k regex:mla_decode_mma_kernel --launch-skip 2 --launch-count 1 \
    b/kvattn$s bench --mla-sparse --backend cuda --iters 2 $D --heads 16 >"$l/ncu_$v.txt" 2>&1
  log "== ncu $v rc=$? $(el) s"
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Issued Warp|No Eligible|Warp Cycles Per Issued|Registers Per|hmma_cycles|inst_executed" \
    "$l/ncu_$v.txt" | tr -s ' ' | head -12 | tee -a "$o/run.txt"
  grep -E "issue_stalled" "$l/ncu_$v.txt" | tr -s ' ' | sort -k3 -g -r | head -7 | tee -a "$o/run.txt"
  pack
done
log "== table (ms, $gpu; alt = ${KVA_ALT:-none})"
python3 - "$o/run.txt" <<'PY' | tee -a "$o/run.txt"
import re, sys, collections
d = collections.defaultdict(lambda: collections.defaultdict(list))
for ln in open(sys.argv[1]):
    m = re.match(r"r(\d+) (base|new|alt) (.*?): .* ([0-9.]+) ms ", ln)
    if m: d[m.group(3)][m.group(2)].append(float(m.group(4)))
for k, v in d.items():
    f = lambda s: "/".join("%.4f" % x for x in v.get(s, []))
    b = v.get("base", [])
    rr = " ".join("base/%s %.3f" % (s, min(b) / min(v[s])) for s in ("new", "alt") if b and v.get(s))
    print("%-24s base %-15s new %-15s alt %-15s %s" % (k, f("base"), f("new"), f("alt"), rr))
p = lambda s: min(d["decode H64 (H16 padded)"].get(s, [0]) or [0]) / max(1e-9, min(d["decode H16"].get(s, [1e9]) or [1e9]))
print("H16 vs padded H64 (same side, best of 2): " + " ".join("%s %.2fx" % (s, p(s)) for s in ("base", "new", "alt") if d["decode H16"].get(s)))
PY
log "bench rows without \"check ok\": $(grep -E '^r[12] ' "$o/run.txt" | grep -vc 'check ok')"
pack
log "== end $(el) s"
