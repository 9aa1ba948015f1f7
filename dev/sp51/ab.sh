#!/usr/bin/env bash
# dev/sp51/ab.sh - the device call of sp51 (issue 17: the producer warp of
# the sparse MLA decode at H <= 16), after dev/sp50/ab.sh. Builds one tree
# whole (KVA_FULL, default "new" = branch sp51: kvattn_cli and the
# KVA_TARGETS tests; CUDA with -lineinfo, in build-sp51/ at the checkout's
# root, which a warm machine keeps, fed by a copy that changes only the
# files that differ), then makes variant binaries: each recompiles the
# KVA_TUS (mla_sparse.cu) of another tree (optionally patched, with extra
# defines) and relinks the CLI (kvattn_<name>) and, for the names in
# KVA_VTESTS, test_cuda_mla_sparse (test_cuda_mla_sparse_<name>) with them:
#   base  main's mla_sparse.cu with main's headers (every other object of
#         the CLI has main's SASS: VM log)
#   p2    new with two copying producer warps (p2.patch)
#   early new with a stage released after the row-max barrier of
#         ml_st_tile instead of after P's barrier (early.patch)
#   nan   new with the raw stages NaN-filled at the CTA's start (nan.patch):
#         the control of nz, must pass
#   nz    nan without the zero rows of unused keys (nz.patch): the planted
#         fault, test_cuda_mla_sparse must FAIL
#     KVA_VARS="name=tree[:patch (in the full tree's dev/sp51)[:defines]] ..."
# Then, gated on the elapsed time (KVA_END, seconds): the tests (KVA_TESTS on
# the full tree, then test_cuda_mla_sparse quick of each KVA_VTESTS side),
# the rows of every side in KVA_SIDES_AB alternated over KVA_ROUNDS rounds
# (odd rounds in order, even rounds reversed), every run checked against the
# reference; Nsight Compute of one H 16 launch per side in KVA_NCU_SIDES;
# memcheck of new's test_cuda_mla_sparse quick (KVA_MEMCHECK=1); a table
# last. Run from the checkout's root (staging: .dev/sp51/new = branch sp51,
# .dev/sp51/base = main):
#   OUT=$OUT bash .dev/sp51/new/dev/sp51/ab.sh .dev/sp51
set -u
root=$(pwd)
top=$(cd "$1" && pwd)
o=${OUT:-/tmp/out}
l=/tmp/sp51l
END=${KVA_END:-210}
KVA_VARS=${KVA_VARS-base=base p2=new:p2.patch early=new:early.patch nan=new:nan.patch nz=new:nz.patch}
KVA_VTESTS=${KVA_VTESTS-p2 early nan nz}
KVA_TARGETS=${KVA_TARGETS-test_cuda_mla_sparse test_cuda_mla_nan test_cuda_mla}
KVA_TESTS=${KVA_TESTS-test_cuda_mla_sparse test_cuda_mla_nan test_cuda_mla:KVA_TEST_QUICK=1}
KVA_NCU_SIDES=${KVA_NCU_SIDES-new}
KVA_MEMCHECK=${KVA_MEMCHECK-1}
FULL=${KVA_FULL:-new}
mkdir -p "$o" "$l"
t0=$(date +%s)
el() { echo $(($(date +%s) - t0)); }
log() { echo "$*" | tee -a "$o/run.txt"; }
pack() { tar -czf "$o/logs.tgz" -C "$l" . 2>/dev/null; }
gpu=$(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | head -1)
log "== GPU: $gpu; full tree $FULL; vars ${KVA_VARS:-none}"
# The build's source copy: only files whose bytes differ are replaced, so a
# warm machine's build folder rebuilds what changed.
bs=$root/build-sp51
sync_tree() { # src dst
  (cd "$1" && find . -path ./dev -prune -o -path ./bench/results -prune -o -type f -print) |
    while read -r f; do
      cmp -s "$1/$f" "$2/$f" || { mkdir -p "$2/$(dirname "$f")"; cp "$1/$f" "$2/$f"; }
    done
}
[ -d "$bs/bd" ] && log "warm build folder found" || log "cold build folder"
mkdir -p "$bs/src"
sync_tree "$top/$FULL" "$bs/src"
cmake -S "$bs/src" -B "$bs/bd" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_CUDA_FLAGS=-lineinfo -DKVA_WITH_OPENSSL=OFF \
  -DKVA_WITH_XXHASH=OFF -DKVA_WITH_CJSON=OFF -DKVA_WITH_MPI=OFF -DKVA_WITH_NCCL=OFF \
  >"$l/cfg.log" 2>&1 || { log "CONFIGURE FAILED"; tail "$l/cfg.log"; pack; exit 1; }
TUS=${KVA_TUS:-src/attn/cuda/mla_sparse.cu}
TARGETS="kvattn_cli ${KVA_TARGETS:-}"
# Variant objects in parallel with the build (their compile commands are the
# full tree's, with the source root and output replaced).
mkdir -p "$bs/var" "$root/b"
declare -A VOBJ
for v in ${KVA_VARS:-}; do
  name=${v%%=*} spec=${v#*=}
  IFS=: read -r tree patch defs <<<"$spec"
  vd=$bs/var/$name
  rm -rf "$vd" && mkdir -p "$vd/tree"
  cp -r "$top/$tree/src" "$top/$tree/include" "$vd/tree/"
  if [ -n "${patch:-}" ]; then
    (cd "$vd/tree" && git --git-dir=/dev/null apply "$top/$FULL/dev/sp51/$patch") >"$l/patch_$name.log" 2>&1 ||
      { log "patch $name failed"; cat "$l/patch_$name.log"; }
  fi
  objs=""
  : >"$vd/cc.sh"
  for tu in $TUS; do
    ob=$vd/$(basename "$tu").o
    cmd=$(cd "$bs/bd" && ninja -t commands "CMakeFiles/kvattn_obj.dir/$tu.o" | tail -1)
    cmd=${cmd//$bs\/src/$vd\/tree}
    cmd=$(echo "$cmd" | sed -E "s# -o [^ ]+\$# -o $ob#; s# -MD -MT [^ ]+ -MF [^ ]+##")
    echo "(cd $bs/bd && $cmd ${defs:-}) || exit 1" >>"$vd/cc.sh"
    objs="$objs $ob"
  done
  VOBJ[$name]=$objs
  (bash "$vd/cc.sh" >"$l/cc_$name.log" 2>&1 || echo "cc $name failed" >>"$l/cc_$name.log") &
done
timeout 400 ninja -C "$bs/bd" -j"$(nproc)" $TARGETS >"$l/build.log" 2>&1 ||
  { log "BUILD FAILED"; grep -E "error" "$l/build.log" | head -20 | tee -a "$o/run.txt"; pack; exit 1; }
wait
log "== built $(el) s"
cp "$bs/bd/kvattn" "$root/b/kvattn_$FULL"
for t in ${KVA_TARGETS:-}; do cp "$bs/bd/$t" "$root/b/"; done
link=$(cd "$bs/bd" && ninja -t commands kvattn_cli | tail -1)
tlink=$(cd "$bs/bd" && ninja -t commands test_cuda_mla_sparse | tail -1)
SIDES="$FULL"
VT=""
for v in ${KVA_VARS:-}; do
  name=${v%%=*}
  grep -q failed "$l/cc_$name.log" && { log "variant $name: compile failed"; tail -5 "$l/cc_$name.log"; continue; }
  vd=$bs/var/$name
  cp "$bs/bd/libkvattn.a" "$vd/libkvattn_v.a" && (cd "$vd" && ar r libkvattn_v.a ${VOBJ[$name]}) &&
    c=${link//libkvattn.a/$vd\/libkvattn_v.a} &&
    c=$(echo "$c" | sed -E "s# -o kvattn( |\$)# -o $root/b/kvattn_$name #") &&
    (cd "$bs/bd" && eval "$c") >"$l/link_$name.log" 2>&1 && SIDES="$SIDES $name" ||
    { log "variant $name: link failed"; head -c 600 "$l/link_$name.log"; }
  case " $KVA_VTESTS " in *" $name "*)
    c=${tlink//libkvattn.a/$vd\/libkvattn_v.a}
    c=$(echo "$c" | sed -E "s# -o test_cuda_mla_sparse( |\$)# -o $root/b/test_cuda_mla_sparse_$name #")
    (cd "$bs/bd" && eval "$c") >>"$l/link_$name.log" 2>&1 && VT="$VT $name" ||
      log "variant $name: test link failed" ;;
  esac
done
log "sides: $SIDES ($(el) s)"
# Smoke: one short H 16 run of the full tree first; a hang or a wrong result
# there stops the call before the tests and rows spend their time limits.
D="--q-len 2 --topk 2048"
x=$(timeout 20 "$root/b/kvattn_$FULL" bench --mla-sparse --backend cuda --iters 2 $D --batch 16 \
  --context 8192 --heads 16 2>&1 | tail -3 | tr -s ' ')
rc=$?
log "smoke ($FULL, H16 R16) rc=$rc: $x"
if ! echo "$x" | grep -q 'check ok'; then
  log "SMOKE FAILED: nothing else run"
  pack
  exit 1
fi
for t in ${KVA_TESTS:-}; do
  [ "$(el)" -lt "$END" ] || { log "test $t skipped (time)"; continue; }
  tn=${t%%:*} env=""
  [ "$t" != "$tn" ] && env=${t#*:}
  s=$(date +%s)
  env $env timeout 90 "$root/b/$tn" >"$l/test_$tn.log" 2>&1
  rc=$?
  log "test $tn ${env} rc=$rc ($(($(date +%s) - s)) s): $(grep -iE 'passed|failed' "$l/test_$tn.log" | tail -1 | cut -c1-150)"
  [ $rc = 0 ] || grep -hiE "FAIL|bad|error" "$l/test_$tn.log" | head -8 | tee -a "$o/run.txt"
done
# The variants' test_cuda_mla_sparse (quick), in parallel: p2, early and nan must
# pass, nz (the planted fault) must fail.
for v in $VT; do
  [ "$(el)" -lt "$END" ] || { log "test variant $v skipped (time)"; continue; }
  (KVA_TEST_QUICK=1 timeout 90 "$root/b/test_cuda_mla_sparse_$v" >"$l/vtest_$v.log" 2>&1
    echo $? >"$l/vtest_$v.rc") &
done
wait
for v in $VT; do
  [ -f "$l/vtest_$v.rc" ] || continue
  log "test_cuda_mla_sparse quick ($v) rc=$(cat "$l/vtest_$v.rc"): $(grep -iE 'passed|failed' "$l/vtest_$v.log" | tail -1 | cut -c1-150)"
done
pack
# Rows: "label|args|who" (all: every bench side; pair: base and new only).
ROWS=("H16 8k|$D --batch 128 --context 8192 --heads 16|all"
  "H16 R16 8k|$D --batch 16 --context 8192 --heads 16|all"
  "H8 8k|$D --batch 128 --context 8192 --heads 8|pair"
  "H64 (H16 padded)|$D --batch 128 --context 8192 --heads 64|pair")
BS=""
for v in ${KVA_SIDES_AB-base new p2 early}; do case " $SIDES " in *" $v "*) BS="$BS $v" ;; esac; done
for r in $(seq 1 "${KVA_ROUNDS:-2}"); do
  order=$BS
  [ $((r % 2)) = 0 ] && order=$(echo $SIDES | tr " " "\n" | tac | tr "\n" " ")
  for v in $order; do
    for m in "${ROWS[@]}"; do
      who=${m##*|} args=${m#*|}
      args=${args%|*}
      [ "$who" = all ] || { [ "$who" = pair ] && { [ "$v" = base ] || [ "$v" = "$FULL" ]; }; } || continue
      [ "$(el)" -lt "$((END + 20))" ] || { log "r$r $v ${m%%|*}: skipped (time)"; continue; }
      x=$(timeout 30 "$root/b/kvattn_$v" bench --mla-sparse --backend cuda --iters 20 $args 2>&1 | grep -E ' ms ' | tail -1 | tr -s ' ')
      log "r$r $v ${m%%|*}: $x"
    done
  done
  log "== bench round $r $(el) s"
done
for v in ${KVA_NCU_SIDES:-}; do
  [ "$(el)" -lt "$END" ] || { log "ncu $v skipped (time)"; continue; }
  timeout 60 ncu --clock-control none --section SourceCounters --section WarpStateStats \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --import-source yes \
    -k regex:mla_decode_mma_kernel --launch-skip 2 --launch-count 1 -o /tmp/sp51_$v \
    "$root/b/kvattn_$v" bench --mla-sparse --backend cuda --iters 2 $D --batch 128 --context 8192 \
    --heads 16 >"$l/ncu_$v.log" 2>&1
  log "== ncu $v rc=$? $(el) s"
  ncu -i /tmp/sp51_$v.ncu-rep --page source --csv --print-source sass 2>&1 | gzip >"$o/ncu_${v}_sass.csv.gz"
  ncu -i /tmp/sp51_$v.ncu-rep --page details --csv >"$l/ncu_${v}_details.csv" 2>&1
  grep -E '"(Duration|DRAM Throughput|Memory Throughput|L1/TEX Hit Rate|L2 Hit Rate|Mem Busy|Max Bandwidth|Compute \(SM\) Throughput|Warp Cycles Per Issued Instruction|Issued Warp Per Scheduler|Executed Ipc Active|DRAM Frequency|SM Frequency|Avg. Active Threads Per Warp)"' \
    "$l/ncu_${v}_details.csv" | awk -F'","' '{print "  " $(NF-2) " = " $NF " " $(NF-1)}' | tr -d '"' | tee -a "$o/run.txt"
  python3 "$top/$FULL/dev/sp18/ncu_top.py" "$o/ncu_${v}_sass.csv.gz" 20 2>&1 | tee -a "$o/run.txt" | head -60
  pack
done
if [ "$KVA_MEMCHECK" = 1 ] && [ "$(el)" -lt "$END" ]; then
  KVA_TEST_QUICK=1 timeout 100 compute-sanitizer --tool memcheck "$root/b/test_cuda_mla_sparse" >"$l/memcheck.log" 2>&1
  log "memcheck test_cuda_mla_sparse quick rc=$?: $(grep -E 'ERROR SUMMARY' "$l/memcheck.log" | tail -1)"
fi
log "== table (ms, $gpu)"
python3 - "$o/run.txt" <<'PY' | tee -a "$o/run.txt"
import re, sys, collections
d = collections.defaultdict(lambda: collections.defaultdict(list))
for ln in open(sys.argv[1]):
    m = re.match(r"r(\d+) (\S+) (.*?): .* ([0-9.]+) ms ", ln)
    if m: d[m.group(3)][m.group(2)].append(float(m.group(4)))
for k, v in d.items():
    print("%-18s " % k + "  ".join("%s %s" % (s, "/".join("%.4f" % x for x in xs)) for s, xs in v.items()))
for k, v in d.items():
    for s in v:
        if s != "base" and v.get("base"):
            print("%-18s base / %s (best): %.3f" % (k, s, min(v["base"]) / min(v[s])))
for s in sorted({s for v in d.values() for s in v}):
    a, b = d["H64 (H16 padded)"].get(s), d["H16 8k"].get(s)
    if a and b: print("H16 vs padded H64 (%s, best): %.3fx" % (s, min(a) / min(b)))
PY
log "bench rows without \"check ok\": $(grep -E '^r[0-9]+ ' "$o/run.txt" | grep -v skipped | grep -vc 'check ok')"
pack
log "== end $(el) s"
