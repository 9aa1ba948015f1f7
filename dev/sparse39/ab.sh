#!/usr/bin/env bash
# dev/sparse39/ab.sh - one device call for the sparse MLA fp8_ds_mla decode on
# the wgmma body (issue 17): main ("base") against this tree ("new": the
# producer warpgroup, MW_SCHED_ALT_PROD) and, optionally, a third tree ("alt",
# KVA_ALT=DIR: its mla_sparse_wgmma.cu with its own headers; sparse38-coal
# was measured on its own meanwhile and lost, so none is needed). dev/sparse38/ab.sh with the new kernel's hang guards and base's
# ncu left out. Builds this tree (kvattn, test_cuda_mla_sparse), compiles
# base's (and alt's) mla_sparse_wgmma.cu (the only file whose code differs:
# every other kernel's SASS is main's; checked on the VM) and relinks kvattn
# as kvattn_base (kvattn_alt); then
#   1. smoke runs (H 128 fp8_ds_mla and a short top-k, checked; new first:
#      a hang or failure of new stops the call here);
#   2. test_cuda_mla_sparse (all cases; both kernels forced, both modes);
#   3. the issue-17 rows over fp8_ds_mla, the sides alternated twice (every
#      run checked against the reference backend);
#   4. Nsight Compute of one decode launch of new (stall breakdown) and
#      compute-sanitizer memcheck of test_cuda_mla_sparse quick, while the
#      elapsed time allows (KVA_NCU_BY, KVA_MC_BY, seconds);
# and prints a table last (about 150 s on 16 cores, ~50-60 of them the
# build; a third tree adds ~30 s). Run from the parent of the trees:
#   OUT=$OUT bash new/dev/sparse39/ab.sh base new
# (or as dev/x4/multi.sh's "sp" experiment, trees in .dev/x4m/sp, with
#  SP_CMD='bash new/dev/sparse39/ab.sh base new'; the GPU named is the first
#  of CUDA_VISIBLE_DEVICES).
set -u
base=$(cd "$1" && pwd) new=$(cd "$2" && pwd)
o=${OUT:-/tmp/out}
l=/tmp/s39l
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
alt=${KVA_ALT:+$(cd "$KVA_ALT" && pwd)}
sides="base new"; [ -n "$alt" ] && sides="base new alt"
cc() { # cc TREE OUTDIR: TREE's mla_sparse_wgmma.cu with TREE's headers
  nvcc -DKVA_CUDA_SM90A=1 -DKVA_HAVE_CUDA=1 -DKVA_VERSION_STRING=\"0.1.0\" -I"$1/include" \
    -I"$1/src/core" -I"$1/src/plan" -O3 -DNDEBUG \
    --generate-code=arch=compute_90a,code=[compute_90a,sm_90a] -Xcompiler=-fPIC \
    -Xcompiler=-fvisibility=hidden -std=c++17 -x cu -c "$1/src/attn/cuda/mla_sparse_wgmma.cu" \
    -o "$2/mla_sparse_wgmma.cu.o"
}
(cc "$base" bo/base >"$l/cc_base.log" 2>&1) &
[ -n "$alt" ] && (cc "$alt" bo/alt >"$l/cc_alt.log" 2>&1) &
timeout 300 ninja -C bd -j"$(nproc)" kvattn_cli test_cuda_mla_sparse >"$l/build.log" 2>&1 ||
  { log "BUILD FAILED"; grep -E "error" "$l/build.log" | head -20 | tee -a "$o/run.txt"; pack; exit 1; }
wait
log "== built $(el) s"
cp bd/kvattn bd/test_cuda_mla_sparse b/
for v in base ${alt:+alt}; do
  cp bd/libkvattn.a bo/$v/libkvattn_$v.a && (cd bo/$v && ar r libkvattn_$v.a mla_sparse_wgmma.cu.o) ||
    log "$v archive failed"
  cmd=$(cd bd && ninja -t commands kvattn_cli | tail -1)
  cmd=${cmd//libkvattn.a/..\/bo\/$v\/libkvattn_$v.a}
  cmd=$(echo "$cmd" | sed -E "s# -o kvattn( |\$)# -o ../b/kvattn_$v #")
  (cd bd && eval "$cmd") >"$l/link_$v.log" 2>&1 || { log "$v link failed"; head -c 600 "$l/link_$v.log"; }
done
ls b | tr '\n' ' ' | tee -a "$o/run.txt"; echo | tee -a "$o/run.txt"
SM=("--iters 2 --batch 8 --q-len 2 --context 3000 --heads 128 --topk 512"
  "--iters 2 --batch 4 --q-len 3 --context 700 --heads 96 --topk 96")
for v in new base ${alt:+alt}; do
  s=""; [ $v != new ] && s=_$v
  for i in 0 1; do
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
timeout 150 b/test_cuda_mla_sparse >"$l/test_sparse.log" 2>&1
trc=$?
log "test_cuda_mla_sparse (all) rc=$trc: $(grep -E 'passed|FAILED|failed' "$l/test_sparse.log" | tail -1 | cut -c1-140)"
[ $trc = 124 ] && { log "test_cuda_mla_sparse timed out (a hang?): new left out of the bench"; tail -3 "$l/test_sparse.log" | tee -a "$o/run.txt"; sides=${sides/new/}; }
grep -hE "FAILED|CHECK failed" "$l/test_sparse.log" | head -10 | tee -a "$o/run.txt"
log "== tests $(el) s"
pack
S="--batch 128 --q-len 2 --context 8192 --heads 128 --topk 2048 --iters 2"
ncu_run() { # ncu_run SIDE...
for v in "$@"; do
  [ "$(el)" -lt "${KVA_NCU_BY:-170}" ] || { log "ncu $v skipped (time)"; continue; }
  s=""; [ $v != new ] && s=_$v
  timeout 70 ncu --clock-control none --section SpeedOfLight --section WarpStateStats \
    --section SourceCounters --section Occupancy \
    --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__t_sector_hit_rate.pct' \
    -k regex:mla_wgmma_kernel --launch-skip 2 --launch-count 1 \
    b/kvattn$s bench --mla-sparse --backend cuda $S >"$l/ncu_$v.txt" 2>&1
  log "== ncu $v rc=$? $(el) s"
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Issued Warp|Eligible Warps|No Eligible|Warp Cycles Per Issued|L1/TEX Hit|L2 Hit|Registers Per|hmma_cycles|sector_hit" \
    "$l/ncu_$v.txt" | tr -s ' ' | head -14 | tee -a "$o/run.txt"
  grep -E "issue_stalled" "$l/ncu_$v.txt" | tr -s ' ' | sort -k3 -g -r | head -9 | tee -a "$o/run.txt"
  pack
done
}
ROWS=("decode H128 fp8|--batch 128 --q-len 2 --context 8192 --heads 128 --topk 2048"
  "prefill 4k fp8 mixed|--batch 0 --prefill 4096 --context 8192 --heads 128 --topk 2048")
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
[ $newok = 1 ] && ncu_run new
if [ $newok = 1 ] && [ "$(el)" -lt "${KVA_MC_BY:-185}" ]; then
  KVA_TEST_QUICK=1 timeout 60 compute-sanitizer --tool memcheck b/test_cuda_mla_sparse >"$l/memcheck.log" 2>&1
  log "memcheck test_cuda_mla_sparse quick rc=$?: $(grep -E 'ERROR SUMMARY' "$l/memcheck.log" | tail -1)"
else
  log "memcheck skipped (time)"
fi
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
    print("%-22s base %-15s new %-15s alt %-15s %s" % (k, f("base"), f("new"), f("alt"), rr))
PY
log "bench rows without \"check ok\": $(grep -E '^r[12] ' "$o/run.txt" | grep -vc 'check ok')"
pack
log "== end $(el) s"
