#!/usr/bin/env bash
# dev/mla27/ab.sh BASE NEW - the MLA decode A/B of issue 16's FP8 latent work on one GPU, in one
# call: BASE and NEW are two source trees (e.g. `git archive` of main and of a branch).
#   1. builds BASE (90a, Release, the MLA tests and bench_cuda_mla only, no optional deps),
#      keeps its binaries, copies NEW's differing files over the same build tree and rebuilds
#      (only what changed recompiles; NEW must add or remove no source file);
#   2. runs test_cuda_mla, test_cuda_mla_run, test_cuda_mla_sparse of NEW (full sets);
#   3. bench_cuda_mla, base and new alternated twice (base, new, base, new): bf16 and fp8
#      latent caches at H 16 (R 128 x 4k, 16k, 64k) and H 128 (q 1 x 4k, q 2 x 8k; R 128 and 16),
#      page 64; prints a table of medians (ms);
#   4. compute-sanitizer memcheck and racecheck of NEW's test_cuda_mla (KVA_TEST_QUICK=1);
#   5. (if ncu exists, KVA_AB_NCU=1) one ncu warp-state report of NEW's FP8 kernels.
# OUT: log folder (default ./ab_out; at most 8 files). KVA_AB_SHORT=1: the shorter call (no R 16
# q 2 row, round 2 without the reference check, memcheck only, no ncu).
set -uo pipefail
base=$(cd "$1" && pwd); new=$(cd "$2" && pwd)
out=${OUT:-ab_out}; mkdir -p "$out"
W=/tmp/mla27_ab; B=/tmp/mla27_bin
rm -rf "$W" "$B"; mkdir -p "$B/base" "$B/new"; cp -r "$base" "$W"
T="test_cuda_mla test_cuda_mla_run test_cuda_mla_sparse bench_cuda_mla"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader | tee "$out/gpu.txt"
s=$(date +%s)
cmake -S "$W" -B "$W/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF \
  -DKVA_WITH_CJSON=OFF -DKVA_WITH_MPI=OFF -DKVA_WITH_NCCL=OFF >/tmp/mla27_cmake.log 2>&1 ||
  { tail -20 /tmp/mla27_cmake.log; exit 1; }
ninja -C "$W/build" -j16 $T >/tmp/mla27_build_base.log 2>&1 || { tail -40 /tmp/mla27_build_base.log; exit 1; }
for t in $T; do cp "$W/build/$t" "$B/base/"; done
echo "build base: $(( $(date +%s) - s )) s"
s=$(date +%s)
(cd "$new" && find . -type f ! -path './build*') | while read -r f; do
  cmp -s "$new/$f" "$W/$f" || { mkdir -p "$(dirname "$W/$f")"; cp "$new/$f" "$W/$f"; echo "$f"; }
done >"$out/changed.txt"
ninja -C "$W/build" -j16 $T >/tmp/mla27_build_new.log 2>&1 || { tail -40 /tmp/mla27_build_new.log; exit 1; }
for t in $T; do cp "$W/build/$t" "$B/new/"; done
echo "build new: $(( $(date +%s) - s )) s ($(wc -l <"$out/changed.txt") files differ: $(tr '\n' ' ' <"$out/changed.txt"))"

status=0
for t in test_cuda_mla test_cuda_mla_run test_cuda_mla_sparse; do
  timeout 200 "$B/new/$t" >/tmp/mla27_test.log 2>&1
  rc=$?; [ $rc = 0 ] || status=1
  { echo "== $t"; cat /tmp/mla27_test.log; } >>"$out/tests.log"
  echo "test $t (new): rc=$rc; $(tail -1 /tmp/mla27_test.log)"
done
shapes=(
  "--heads 16 --context 4096"
  "--heads 16 --context 16384"
  "--heads 16 --context 65536 --iters 15"
  "--heads 128 --context 4096"
  "--heads 128 --context 8192 --q-len 2"
  "--heads 128 --context 4096 --batch 16"
  "--heads 128 --context 8192 --q-len 2 --batch 16"
)
short=${KVA_AB_SHORT:-0}
[ "$short" = 1 ] && unset 'shapes[6]' 
for round in 1 2; do
  for t in base new; do
    for i in "${!shapes[@]}"; do
      for kq in none fp8; do
        chk=1; [ "$short" = 1 ] && [ $round = 2 ] && chk=0
        line=$("$B/$t/bench_cuda_mla" ${shapes[$i]} --block-size 64 --kv-quant $kq --check $chk 2>&1 | grep "^bench_cuda_mla:" | head -1)
        echo "$t r$round s$i $kq $line" >>"$out/bench_raw.log"
        ms=$(echo "$line" | grep -oE 'median [0-9.]+' | awk '{print $2}')
        ck=$(echo "$line" | grep -oE 'check [a-zA-Z]+' | awk '{print $2}')
        echo "$i $kq $t $round ${ms:-NA} ${ck:-NA}" >>"$out/bench_ms.txt"
      done
    done
  done
done
# The table: per shape and format, base r1 / new r1 / base r2 / new r2 medians (ms), new/base
# (mean of the two rounds' ratios), and fp8/bf16 of each tree (mean of the rounds).
python3 - "$out/bench_ms.txt" <<'EOF' 
import sys, collections
names = ["H16 R128 4k", "H16 R128 16k", "H16 R128 64k", "H128 R128 q1 4k", "H128 R128 q2 8k",
         "H128 R16 q1 4k", "H128 R16 q2 8k"]
d = collections.defaultdict(dict); ck = collections.Counter()
for l in open(sys.argv[1]):
    i, kq, t, r, ms, c = l.split()
    ck[c] += 1
    if ms != "NA": d[(int(i), kq)][(t, int(r))] = float(ms)
print(f"{'shape':18} {'kv':5} {'base1':>8} {'new1':>8} {'base2':>8} {'new2':>8} {'new/base':>8}")
for (i, kq), v in sorted(d.items()):
    g = lambda t, r: v.get((t, r), float('nan'))
    rat = sum(g('new', r) / g('base', r) for r in (1, 2)) / 2
    print(f"{names[i]:18} {'bf16' if kq == 'none' else kq:5} {g('base',1):8.4f} {g('new',1):8.4f} {g('base',2):8.4f} {g('new',2):8.4f} {rat:8.3f}")
print("fp8/bf16 time (mean of rounds):")
for i in range(len(names)):
    a, b = d.get((i, 'fp8'), {}), d.get((i, 'none'), {})
    for t in ('base', 'new'):
        try: print(f"  {names[i]:18} {t:4} {sum(a[(t,r)]/b[(t,r)] for r in (1,2))/2:.3f}")
        except (KeyError, ZeroDivisionError): pass
print("checks:", dict(ck))
EOF
tools="memcheck racecheck"; [ "$short" = 1 ] && tools=memcheck
for tool in $tools; do
  KVA_TEST_QUICK=1 timeout 110 compute-sanitizer --tool $tool --error-exitcode 9 "$B/new/test_cuda_mla" \
    >/tmp/mla27_san_$tool.log 2>&1 &
done
wait
for tool in $tools; do
  cat /tmp/mla27_san_$tool.log >>"$out/san.log"
  echo "$tool test_cuda_mla quick (new): $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' /tmp/mla27_san_$tool.log | tail -1)"
done

if [ "$short" != 1 ] && [ "${KVA_AB_NCU:-1}" = 1 ] && command -v ncu >/dev/null; then
  timeout 50 ncu --section WarpStateStats --section SchedulerStats --section SpeedOfLight \
    -k regex:mla_ --launch-skip 3 --launch-count 1 "$B/new/bench_cuda_mla" --heads 16 --context 16384 \
    --block-size 64 --kv-quant fp8 --iters 5 --check 0 >"$out/ncu.txt" 2>&1
  timeout 50 ncu --section WarpStateStats --section SchedulerStats --section SpeedOfLight \
    -k regex:mla_ --launch-skip 3 --launch-count 1 "$B/new/bench_cuda_mla" --heads 128 --context 4096 \
    --block-size 64 --kv-quant fp8 --iters 5 --check 0 >>"$out/ncu.txt" 2>&1
  echo "ncu: $(grep -c 'Warp Cycles' "$out/ncu.txt") lines"
fi
exit $status
