#!/usr/bin/env bash
# dev/mlapf63/run.sh - one H200 call (issue 16): kva_mla_run's decompression GEMM, second step (src/attn/cuda/
# mla_gemm_wgmma.cu: K and V halves as one product pair per 128 x 256 tile, persistent CTAs streaming k steps across
# tiles two steps ahead, 16-byte epilogue stores, FP8 codes held in registers for a step) against main's wgmma GEMM
# (mlapf62). Staged in .dev/mlapf63: ./new (git archive of the branch), ./base (git archive of main). Call:
#   run(command="bash .dev/mlapf63/new/dev/mlapf63/run.sh", carry=[".dev/mlapf63"], kind="nvidia-h200", timeout_s=200)
# Steps: build base (kvattn_cli) and new (kvattn_cli, test_cuda_mla_run) in parallel (Release, 90a, optional
# libraries off, -j8 each); new's test_cuda_mla_run whole and compute-sanitizer memcheck of its quick set, in
# parallel with a planted fault (the loader takes the current tile's A rows for the next tile: sed on ./new's source,
# only test_cuda_mla_run rebuilt, its quick set must fail; the kvattn binary benchmarked is the one built before);
# then `kvattn bench --mla --backend cuda --mode prefill` (10 iters, phases) base / new alternated over 2 rounds:
# 4k H 128, 16, 32, 1k after an 8k context (4 rounds: the new tokens, 3 context chunks), 4k H 128 on an FP8 latent
# cache; new's 4k H 128 run in round 1 is checked against the reference (request 0, heads 0-1), the rest run
# --no-check. Log $OUT/mlapf63.txt; the table of medians is printed last.
# Knobs: LATE (seconds: round 2 is skipped when round 1 ends later; default 175; no row starts after 190 s),
# J (ninja jobs per tree, 8).
set -uo pipefail
st=$(cd "$(dirname "$0")/../../.." && pwd) # the staged folder (.dev/mlapf63)
res=${OUT:-$st/out}; mkdir -p "$res"; L=$res/mlapf63.txt; tmp=/tmp/mlapf63_logs; mkdir -p "$tmp"
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; T() { echo "## $1: $(el) s" >>"$L"; }
echo "# mlapf63 call, $(date -u '+%F %T') UTC" >>"$L"
echo "# gpu: $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>&1); $(nproc) cores" >>"$L"
CM="-G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DKVA_WITH_OPENSSL=OFF
  -DKVA_WITH_XXHASH=OFF -DKVA_WITH_CJSON=OFF -DKVA_WITH_MPI=OFF -DKVA_WITH_NCCL=OFF"
bld() { # tree build-dir targets...
  local s=$1 b=$2; shift 2
  { cmake -S "$st/$s" -B "$b" $CM && timeout 125 ninja -C "$b" -j"${J:-8}" "$@"; } >"$tmp/build_$s.log" 2>&1
}
bld base /tmp/mlapf63_base kvattn_cli & bp=$!
bld new /tmp/mlapf63_new kvattn_cli test_cuda_mla_run test_cuda_mla_gemm; nrc=$?
wait $bp; brc=$?
T "build base rc=$brc, new rc=$nrc"
for s in base new; do
  grep -m10 -E "error|Error" "$tmp/build_$s.log" | cut -c1-300 >>"$L"
done
N=/tmp/mlapf63_new; B=/tmp/mlapf63_base
if [ $nrc = 0 ]; then
  # new's tests from a copy of its binary, while the planted fault (the loader prefetches the current tile's A
  # row indices as the next tile's: a CTA's later tiles read other rows) is rebuilt into the build's own one
  cp $N/test_cuda_mla_run $tmp/test_new; cp $N/test_cuda_mla_gemm $tmp/gemm_new
  ( KVA_TEST_QUICK=1 timeout 72 compute-sanitizer --tool memcheck --error-exitcode 9 $tmp/test_new \
      >"$tmp/san.log" 2>&1; echo "memcheck test_cuda_mla_run quick: rc=$? $(grep -E 'ERROR SUMMARY' "$tmp/san.log" | tail -1)" >"$tmp/san.txt" ) &
  sp=$!
  ( f="$st/new/src/attn/cuda/mla_gemm_wgmma.cu"
    sed -i 's/gw_rows(p, gw_tile_of(p, L.t + gridDim.x).m0, L.next);/gw_rows(p, gw_tile_of(p, L.t).m0, L.next); \/\/ FAULT/' "$f"
    if grep -q "gw_rows(p, gw_tile_of(p, L.t).m0, L.next); // FAULT" "$f" && timeout 45 ninja -C $N test_cuda_mla_run test_cuda_mla_gemm >"$tmp/fault_build.log" 2>&1; then
      KVA_TEST_QUICK=1 timeout 27 $N/test_cuda_mla_run >"$tmp/fault.log" 2>&1
      echo "planted fault (next tile's A rows = the current tile's), test_cuda_mla_run quick: rc=$? (must fail): $(grep -aE "passed" "$tmp/fault.log" | tail -1) $(grep -acE "FAIL" "$tmp/fault.log") FAIL lines" >"$tmp/fault.txt"
      KVA_TEST_QUICK=1 timeout 20 $N/test_cuda_mla_gemm >"$tmp/fault_gemm.log" 2>&1
      echo "planted fault, test_cuda_mla_gemm quick: rc=$? (must fail): $(grep -aE "passed" "$tmp/fault_gemm.log" | tail -1); $(grep -aE "mismatches" "$tmp/fault_gemm.log" | grep -v ": 0 mismatches" | grep -c "") runs with mismatches of $(grep -ac "mismatches$" "$tmp/fault_gemm.log")" >>"$tmp/fault.txt"
    else echo "planted fault: not applied / not built" >"$tmp/fault.txt"; fi ) &
  fp=$!
  timeout 72 $tmp/test_new >"$tmp/test.log" 2>&1
  echo "test_cuda_mla_run (whole) rc=$?: $(grep -aE "passed|FAIL" "$tmp/test.log" | tail -3 | tr '\n' ' ' | cut -c1-300)" >>"$L"
  grep -a "gemm" "$tmp/test.log" | head -8 >>"$L"
  timeout 40 $tmp/gemm_new >"$tmp/gemm.log" 2>&1
  echo "test_cuda_mla_gemm (whole) rc=$?: $(grep -aE "passed|FAIL" "$tmp/gemm.log" | tail -3 | tr '\n' ' ' | cut -c1-300)" >>"$L"
  grep -aE "sm_90a|mismatches" "$tmp/gemm.log" | grep -aE "sm_90a|ctas 1|[1-9][0-9]* mismatches" | head -12 >>"$L"
  wait $sp; cat "$tmp/san.txt" >>"$L"; grep -aE "FAIL|========= (Invalid|Program|Error)" "$tmp/san.log" | head -5 >>"$L"
  wait $fp; cat "$tmp/fault.txt" >>"$L"; grep -a -m2 "FAIL" "$tmp/fault.log" | cut -c1-250 >>"$L"
  T tests
fi
# bench rows: label|arguments
shapes=("4k H128|4096|--q-len 4096 --heads 128" "4k H16|4096|--q-len 4096 --heads 16" "4k H32|4096|--q-len 4096 --heads 32"
  "1k ctx8k H128|9216|--q-len 1024 --context 8192 --heads 128" "4k H128 fp8|4096|--q-len 4096 --heads 128 --kv-quant fp8")
row() { # round build label keys args...
  local r=$1 w=$2 lab=$3 keys=$4; shift 4
  [ "$(el)" -le 190 ] || { echo "r$r $w $lab: skipped at $(el) s" >>"$L"; return; }
  local d=$B; [ "$w" = new ] && d=$N
  local chk="--no-check"; [ "$w" = new ] && [ "$r" = 1 ] && [ "$lab" = "4k H128" ] && chk=""
  local f="$tmp/bench_${r}_${w}_${lab// /_}.log"
  timeout 40 "$d/kvattn" bench --mla --backend cuda --mode prefill --iters 10 $chk "$@" >"$f" 2>&1
  local rc=$?
  local med=$(grep -aoE "time median [0-9.]+" "$f" | awk '{print $3}')
  local ph=$(grep -aE "phases" "$f" | sed -E 's/.*runs\): //')
  echo "r$r $w $lab rc=$rc: median ${med:-?} ms | $ph" >>"$L"
  grep -aE "check vs ref|FAIL|rror" "$f" | head -2 | sed 's/^/    /' >>"$L"
  echo "$lab|$keys|$w|${med:-nan}|$(echo "$ph" | grep -oE 'decompress [0-9.]+' | awk '{print $2}')|$(echo "$ph" | grep -oE 'attention [0-9.]+' | awk '{print $2}')" >>"$tmp/rows.txt"
}
if [ $nrc = 0 ] && [ $brc = 0 ]; then
  for r in 1 2; do
    if [ $r = 2 ] && [ "$(el)" -gt "${LATE:-175}" ]; then echo "## round 2 skipped at $(el) s" >>"$L"; break; fi
    for s in "${shapes[@]}"; do
      IFS='|' read -r lab keys args <<<"$s"
      if [ $r = 1 ]; then row $r base "$lab" $keys $args; row $r new "$lab" $keys $args
      else row $r new "$lab" $keys $args; row $r base "$lab" $keys $args; fi
    done
    T "bench round $r"
  done
  # the table: medians over rounds of each build's median total and decompress phase
  python3 - "$tmp/rows.txt" >>"$L" <<'PY'
import sys, statistics as S
rows = {}
for l in open(sys.argv[1]):
    lab, keys, w, tot, dec, att = l.strip().split("|")
    f = lambda x: float(x) if x and x != "nan" else float("nan")
    H = int(lab.split("H")[-1].split()[0])
    rows.setdefault(lab, {"gf": 2 * int(keys) * H * 512 * 256 / 1e9}).setdefault(w, []).append((f(tot), f(dec), f(att)))
print("medians over the rounds of each run's median (ms); decompression TFLOP/s = 2 keys H Dc (Dn + Dv) / decompress")
print("%-14s %8s %8s %7s %8s %8s %7s %7s %8s %8s" % ("shape", "base", "new", "total", "b decomp", "n decomp", "b TF/s",
      "n TF/s", "b attn", "n attn"))
for lab, d in rows.items():
    m = lambda w, i: S.median([x[i] for x in d.get(w, [])]) if d.get(w) else float("nan")
    print("%-14s %8.3f %8.3f %+6.1f%% %8.3f %8.3f %7.0f %7.0f %8.3f %8.3f" % (lab, m("base", 0), m("new", 0),
          100 * (m("new", 0) / m("base", 0) - 1), m("base", 1), m("new", 1), d["gf"] / m("base", 1), d["gf"] / m("new", 1),
          m("base", 2), m("new", 2)))
PY
fi
T done
tar -czf "$res/logs.tgz" -C "$tmp" . 2>/dev/null
cat "$L"
