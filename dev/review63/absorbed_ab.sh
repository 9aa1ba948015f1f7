#!/usr/bin/env bash
# dev/review63/absorbed_ab.sh - one H200 call (not run: no device budget left in session 44): kva_mla_run's
# ABSORBED path (the decode path of a serving step) before and after session 44's GEMM work. mlapf62 moved its two
# projections (q_nope . W_UK, o_lat . W_UV) from mma.sync to the wgmma form, mlapf63 made that form persistent; both
# calls timed only --mode prefill, so the absorbed phase was never measured. Staged in .dev/review63: ./new (branch
# review63 or main: the same src/), ./base (git archive of 564475b, session 44's start: mma.sync projections):
#   rm -rf /work/main/.dev/review63 && mkdir -p /work/main/.dev/review63 &&
#   git -C /work/wt/review63 archive --prefix=new/ HEAD | tar -x -C /work/main/.dev/review63 &&
#   git -C /work/main archive --prefix=base/ 564475b | tar -x -C /work/main/.dev/review63
#   run(command="bash .dev/review63/new/dev/review63/absorbed_ab.sh", carry=[".dev/review63"], kind="nvidia-h200", timeout_s=200)
# Steps: build kvattn_cli of both trees in parallel (Release, 90a, optional libraries off, -j8 each); then
# `kvattn bench --mla --backend cuda --mode decode` (20 iters; new's first row checked against the reference, the
# rest --no-check) base / new alternated over 2 rounds on H 128 R 64 4k, H 128 R 128 q 2 4k, H 16 R 64 4k; the
# "absorbed" phase holds both projections, the decode kernel and the merge (the decode kernel is the same code in
# both trees). Log $OUT/review63_absorbed.txt; the table of medians is printed last.
set -uo pipefail
st=$(cd "$(dirname "$0")/../../.." && pwd)
res=${OUT:-$st/out}; mkdir -p "$res"; L=$res/review63_absorbed.txt; tmp=/tmp/review63_ab; mkdir -p "$tmp"
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }; T() { echo "## $1: $(el) s" >>"$L"; }
echo "# review63 absorbed A/B, $(date -u '+%F %T') UTC" >>"$L"
echo "# gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1); $(nproc) cores" >>"$L"
CM="-G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DKVA_WITH_OPENSSL=OFF
  -DKVA_WITH_XXHASH=OFF -DKVA_WITH_CJSON=OFF -DKVA_WITH_MPI=OFF -DKVA_WITH_NCCL=OFF"
bld() { { cmake -S "$st/$1" -B "/tmp/review63_ab_$1" $CM && timeout 125 ninja -C "/tmp/review63_ab_$1" -j"${J:-8}" kvattn_cli; } >"$tmp/build_$1.log" 2>&1; }
bld base & bp=$!
bld new; nrc=$?
wait $bp; brc=$?
T "build base rc=$brc, new rc=$nrc"
for s in base new; do grep -m5 -E "error|Error" "$tmp/build_$s.log" | cut -c1-300 >>"$L"; done
shapes=("H128 R64 4k|--heads 128 --batch 64 --context 4096" "H128 R128 q2 4k|--heads 128 --batch 128 --q-len 2 --context 4096"
  "H16 R64 4k|--heads 16 --batch 64 --context 4096")
row() { # round tree label args...
  local r=$1 w=$2 lab=$3; shift 3
  [ "$(el)" -le 180 ] || { echo "r$r $w $lab: skipped at $(el) s" >>"$L"; return; }
  local chk="--no-check"; [ "$w" = new ] && [ "$r" = 1 ] && [ "$lab" = "H128 R64 4k" ] && chk=""
  local f="$tmp/b_${r}_${w}_${lab// /_}.log"
  timeout 40 "/tmp/review63_ab_$w/kvattn" bench --mla --backend cuda --mode decode --iters 20 $chk "$@" >"$f" 2>&1
  local rc=$? med ph
  med=$(grep -aoE "time median [0-9.]+" "$f" | awk '{print $3}')
  ph=$(grep -aE "phases" "$f" | sed -E 's/.*runs\): //')
  echo "r$r $w $lab rc=$rc: median ${med:-?} ms | $ph" >>"$L"
  grep -aE "check vs ref|FAIL|rror" "$f" | head -2 | sed 's/^/    /' >>"$L"
  echo "$lab|$w|${med:-nan}|$(echo "$ph" | grep -oE 'absorbed [0-9.]+' | awk '{print $2}')" >>"$tmp/rows.txt"
}
: >"$tmp/rows.txt"
if [ $nrc = 0 ] && [ $brc = 0 ]; then
  for r in 1 2; do
    for sh in "${shapes[@]}"; do
      lab=${sh%%|*}; args=${sh#*|}
      if [ $r = 1 ]; then row $r base "$lab" $args; row $r new "$lab" $args
      else row $r new "$lab" $args; row $r base "$lab" $args; fi
    done
    T "round $r"
  done
fi
{
  echo "medians over the rounds of each run's median (ms); absorbed = both projections + decode + merge"
  printf "%-18s %8s %8s %7s %9s %9s\n" shape base new total "b absorb" "n absorb"
  for sh in "${shapes[@]}"; do
    lab=${sh%%|*}
    med() { grep -a "^$lab|$1|" "$tmp/rows.txt" | cut -d'|' -f"$2" | sort -g | awk '{a[NR]=$1} END {if (NR==0) print "nan"; else if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
    b=$(med base 3); n=$(med new 3); ba=$(med base 4); na=$(med new 4)
    printf "%-18s %8s %8s %7s %9s %9s\n" "$lab" "$b" "$n" \
      "$(awk -v b="$b" -v n="$n" 'BEGIN {if (b+0 > 0) printf "%+.1f%%", 100 * (n - b) / b; else print "?"}')" "$ba" "$na"
  done
} | tee -a "$L"
T done
