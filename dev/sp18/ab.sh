#!/usr/bin/env bash
# dev/sp18/ab.sh - one short device call for the sparse MLA decode at H <= 16
# (issue 17), after dev/sp17/ab.sh: main ("base") against a tree ("new",
# e.g. branch sp18-cheap: the short e4m3 -> bf16 conversion with the 2^120
# folds). Builds new (kvattn, test_cuda_mla_sparse; CUDA with -lineinfo),
# compiles base's mla_sparse.cu with base's headers (-lineinfo) and relinks
# kvattn with it; then, gated on the elapsed time (KVA_END, seconds):
#   1. one smoke run per side (H 16, checked against the reference backend);
#   2. test_cuda_mla_sparse, all cases, on new;
#   3. the rows, base and new alternated twice (every run checked against
#      the reference backend): H 16 R 128, H 16 R 16, H 64 = H 16 padded
#      (wgmma), H 128 (wgmma, control);
#   (KVA_TEST=0 skips 1-2, KVA_BENCH=0 skips 3: an ncu-only call)
#   4. Nsight Compute SourceCounters of one H 16 launch per side in
#      KVA_NCU_SIDES (default "base new"): the SASS source page as CSV
#      and the CUDA source page (-lineinfo) as CSV (gzipped to $OUT) and the
#      top stall lines (dev/sp18/ncu_top.py);
# and prints a table last. Run from the parent of the trees:
#   OUT=$OUT bash new/dev/sp18/ab.sh base new
set -u
base=$(cd "$1" && pwd) new=$(cd "$2" && pwd)
o=${OUT:-/tmp/out}
l=/tmp/sp18l
END=${KVA_END:-100}
mkdir -p "$o" "$l"
t0=$(date +%s)
el() { echo $(($(date +%s) - t0)); }
log() { echo "$*" | tee -a "$o/run.txt"; }
pack() { tar -czf "$o/logs.tgz" -C "$l" . 2>/dev/null; }
gpu=$(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | head -1)
log "== GPU: $gpu"
cd "$new"
cmake -S . -B bd -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DCMAKE_CUDA_FLAGS=-lineinfo -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF -DKVA_WITH_CJSON=OFF \
  -DKVA_WITH_MPI=OFF -DKVA_WITH_NCCL=OFF >"$l/cfg.log" 2>&1 || { log "CONFIGURE FAILED"; tail "$l/cfg.log"; pack; exit 1; }
mkdir -p bo/base b
(nvcc -DKVA_CUDA_SM90A=1 -DKVA_HAVE_CUDA=1 -DKVA_VERSION_STRING=\"0.1.0\" -I"$base/include" \
  -I"$base/src/core" -I"$base/src/plan" -O3 -DNDEBUG -lineinfo \
  --generate-code=arch=compute_90a,code=[compute_90a,sm_90a] -Xcompiler=-fPIC \
  -Xcompiler=-fvisibility=hidden -std=c++17 -x cu -c "$base/src/attn/cuda/mla_sparse.cu" \
  -o bo/base/mla_sparse.cu.o >"$l/cc_base.log" 2>&1) &
timeout 200 ninja -C bd -j"$(nproc)" kvattn_cli test_cuda_mla_sparse >"$l/build.log" 2>&1 ||
  { log "BUILD FAILED"; grep -E "error" "$l/build.log" | head -20 | tee -a "$o/run.txt"; pack; exit 1; }
wait
log "== built $(el) s"
cp bd/kvattn bd/test_cuda_mla_sparse b/
cmd=$(cd bd && ninja -t commands kvattn_cli | tail -1)
cmd=${cmd//libkvattn.a/..\/bo\/base\/libkvattn_base.a}
cmd=$(echo "$cmd" | sed -E "s# -o kvattn( |\$)# -o ../b/kvattn_base #")
cp bd/libkvattn.a bo/base/libkvattn_base.a && (cd bo/base && ar r libkvattn_base.a mla_sparse.cu.o) &&
  (cd bd && eval "$cmd") >"$l/link_base.log" 2>&1 || { log "base link failed"; head -c 600 "$l/link_base.log"; }
ls b | tr '\n' ' ' | tee -a "$o/run.txt"; echo | tee -a "$o/run.txt"
sides="base new"
[ "${KVA_TEST:-1}" = 0 ] || for v in new base; do
  s=""; [ $v != new ] && s=_$v
  timeout 30 b/kvattn$s bench --mla-sparse --backend cuda --iters 2 --batch 8 --q-len 2 \
    --context 3000 --heads 16 --topk 512 >"$l/smoke_$v.log" 2>&1
  rc=$?
  log "smoke $v rc=$rc: $(grep -E ' ms ' "$l/smoke_$v.log" | tail -1 | tr -s ' ')"
  [ $rc = 0 ] && grep -q "check ok" "$l/smoke_$v.log" || { tail -5 "$l/smoke_$v.log" | tee -a "$o/run.txt"; [ $v = new ] && sides=base; }
done
case "${KVA_TEST:-1} $sides " in 1*" new "*)
  timeout 60 b/test_cuda_mla_sparse >"$l/test_sparse.log" 2>&1
  log "test_cuda_mla_sparse new (all) rc=$?: $(grep -E 'passed|FAILED|failed' "$l/test_sparse.log" | tail -1 | cut -c1-140)"
  grep -hE "FAILED|CHECK failed|bad" "$l/test_sparse.log" | head -10 | tee -a "$o/run.txt" ;;
esac
log "== tests $(el) s"
pack
D="--batch 128 --q-len 2 --context 8192 --topk 2048"
ROWS=("decode H16|$D --heads 16" "decode H16 R16|--batch 16 --q-len 2 --context 8192 --topk 2048 --heads 16"
  "decode H64 (H16 padded)|$D --heads 64" "decode H128|$D --heads 128")
[ "${KVA_BENCH:-1}" = 0 ] && ROWS=()
for r in 1 2; do
  order=$sides; [ $r = 2 ] && order=$(echo $sides | tr " " "\n" | tac | tr "\n" " ")
  for v in $order; do
    s=""; [ $v != new ] && s=_$v
    for m in "${ROWS[@]}"; do
      [ "$(el)" -lt "$((END + 15))" ] || { log "r$r $v ${m%%|*}: skipped (time)"; continue; }
      x=$(timeout 30 b/kvattn$s bench --mla-sparse --backend cuda --iters 20 ${m#*|} 2>&1 | grep -E ' ms ' | tail -1 | tr -s ' ')
      log "r$r $v ${m%%|*}: $x"
    done
  done
  log "== bench round $r $(el) s"
done
for v in ${KVA_NCU_SIDES:-base new}; do
  [ "$(el)" -lt "$END" ] || { log "ncu $v skipped (time)"; continue; }
  s=""; [ $v != new ] && s=_$v
  timeout 30 ncu --clock-control none --section SourceCounters --section WarpStateStats \
    --import-source yes -k regex:mla_decode_mma_kernel --launch-skip 2 --launch-count 1 -o /tmp/sp18_$v \
    b/kvattn$s bench --mla-sparse --backend cuda --iters 2 $D --heads 16 >"$l/ncu_$v.log" 2>&1
  log "== ncu $v rc=$? $(el) s"
  ncu -i /tmp/sp18_$v.ncu-rep --page source --csv --print-source sass 2>&1 | gzip >"$o/ncu_${v}_sass.csv.gz"
  ncu -i /tmp/sp18_$v.ncu-rep --page source --csv --print-source cuda 2>&1 | gzip >"$o/ncu_${v}_cuda.csv.gz"
  ncu -i /tmp/sp18_$v.ncu-rep --page details --csv >"$l/ncu_${v}_details.csv" 2>&1
  python3 "$new/dev/sp18/ncu_top.py" "$o/ncu_${v}_sass.csv.gz" 16 2>&1 | tee -a "$o/run.txt" | head -40
  pack
done
log "== table (ms, $gpu; new = $(basename "$new"))"
python3 - "$o/run.txt" <<'PY' | tee -a "$o/run.txt"
import re, sys, collections
d = collections.defaultdict(lambda: collections.defaultdict(list))
for ln in open(sys.argv[1]):
    m = re.match(r"r(\d+) (base|new) (.*?): .* ([0-9.]+) ms ", ln)
    if m: d[m.group(3)][m.group(2)].append(float(m.group(4)))
for k, v in d.items():
    f = lambda s: "/".join("%.4f" % x for x in v.get(s, []))
    b, n = v.get("base", []), v.get("new", [])
    rr = "base/new %.3f" % (min(b) / min(n)) if b and n else ""
    print("%-24s base %-15s new %-15s %s" % (k, f("base"), f("new"), rr))
p = lambda s: min(d["decode H64 (H16 padded)"].get(s, [0]) or [0]) / max(1e-9, min(d["decode H16"].get(s, [1e9]) or [1e9]))
print("H16 vs padded H64 (same side, best of 2): " + " ".join("%s %.2fx" % (s, p(s)) for s in ("base", "new") if d["decode H16"].get(s)))
PY
log "bench rows without \"check ok\": $(grep -E '^r[12] ' "$o/run.txt" | grep -v skipped | grep -vc 'check ok')"
pack
log "== end $(el) s"
