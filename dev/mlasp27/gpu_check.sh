#!/usr/bin/env bash
# dev/mlasp27/gpu_check.sh BASE NEW - one-call GPU check of branch mlasp27 (the sparse MLA's
# mma.sync kernel folded into the dense decode's body as a key-source policy), BASE and NEW
# being two source trees (e.g. `git archive` of main and of the branch):
#   1. builds BASE (sm_90a, Release, no optional deps; the MLA tests, bench_cuda_mla, kvattn),
#      keeps its binaries, copies NEW's differing files over the same build tree and rebuilds
#      (only what changed recompiles; NEW must add or remove no source file);
#   2. NEW's test_cuda_mla_sparse, test_cuda_mla, test_cuda_mla_run (full sets; every sparse
#      case runs on both forced kernels), then compute-sanitizer memcheck of NEW's
#      test_cuda_mla_sparse and test_cuda_mla (KVA_TEST_QUICK=1), side by side;
#   3. base and new alternated twice (base, new, base, new): `kvattn bench --mla-sparse
#      --backend cuda` (issue 17's suite: its H 16 and forced mma.sync rows run the changed
#      kernel), three more sparse shapes on mma.sync (H 16 bf16 rows: 16-row tiles; H 32
#      fp8_ds_mla and bf16 rows: 32-row tiles), and the dense MLA decode on mma.sync
#      (bench_cuda_mla, bf16 and FP8 E4M3 latent caches: H 16 q 1 16k = the 16-row kernel
#      with Q in registers, H 16 q 2 8k = 32-row items, H 32 q 2 4k forced onto mma.sync =
#      64-row items); prints a table of medians (ms) and new/base (mean of the rounds).
# OUT: log folder (default ./gpu_check_out). KVA_GC_STEPS: default "build test sanitize bench";
# KVA_GC_ROUNDS: bench rounds (default 2); KVA_GC_DENSE=0 leaves the dense rows out.
# Expected on an H100 (estimate, not measured): base build ~150 s, new ~60 s, tests ~15 s,
# memcheck ~60 s, bench ~40 s per tree and round (half without the dense rows).
# NEW's files that differ from BASE's replace them, so NEW must contain BASE's other changes:
# with main ahead of the branch, stage NEW as the merge of main and mlasp27 (on the VM):
#   d=/work/main/.dev/mlasp27; rm -rf $d && mkdir -p $d
#   git -C /work/main archive --prefix=base/ main | tar -x -C $d
#   T=$(git -C /work/main merge-tree --write-tree main mlasp27 | head -1)
#   git -C /work/main archive --prefix=new/ $T | tar -x -C $d
# and run on the device (carry .dev/mlasp27, timeout 420):
#   cd .dev/mlasp27 && OUT=$OUT bash new/dev/mlasp27/gpu_check.sh base new
set -uo pipefail
base=$(cd "$1" && pwd); new=$(cd "$2" && pwd)
out=${OUT:-gpu_check_out}; mkdir -p "$out"
steps=" ${KVA_GC_STEPS:-build test sanitize bench} "
has() { [[ "$steps" == *" $1 "* ]]; }
W=/tmp/mlasp27_gc; B=/tmp/mlasp27_bin
T="test_cuda_mla test_cuda_mla_run test_cuda_mla_sparse bench_cuda_mla kvattn_cli"
status=0
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader | tee "$out/gpu.txt"
if has build; then
  rm -rf "$W" "$B"; mkdir -p "$B/base" "$B/new"; cp -r "$base" "$W"
  s=$(date +%s)
  cmake -S "$W" -B "$W/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKVA_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DKVA_WITH_OPENSSL=OFF -DKVA_WITH_XXHASH=OFF \
    -DKVA_WITH_CJSON=OFF -DKVA_WITH_MPI=OFF -DKVA_WITH_NCCL=OFF >"$out/cmake.log" 2>&1 ||
    { tail -20 "$out/cmake.log"; exit 1; }
  timeout 400 ninja -C "$W/build" -j16 $T >"$out/build_base.log" 2>&1 || { tail -40 "$out/build_base.log"; exit 1; }
  for t in test_cuda_mla test_cuda_mla_run test_cuda_mla_sparse bench_cuda_mla kvattn; do cp "$W/build/$t" "$B/base/"; done
  echo "build base: $(( $(date +%s) - s )) s"
  s=$(date +%s)
  (cd "$new" && find . -type f ! -path './build*') | while read -r f; do
    cmp -s "$new/$f" "$W/$f" || { mkdir -p "$(dirname "$W/$f")"; cp "$new/$f" "$W/$f"; echo "$f"; }
  done >"$out/changed.txt"
  timeout 300 ninja -C "$W/build" -j16 $T >"$out/build_new.log" 2>&1 || { tail -40 "$out/build_new.log"; exit 1; }
  for t in test_cuda_mla test_cuda_mla_run test_cuda_mla_sparse bench_cuda_mla kvattn; do cp "$W/build/$t" "$B/new/"; done
  echo "build new: $(( $(date +%s) - s )) s ($(wc -l <"$out/changed.txt") files differ: $(tr '\n' ' ' <"$out/changed.txt"))"
fi
if has test; then
  for t in test_cuda_mla_sparse test_cuda_mla test_cuda_mla_run; do
    timeout 200 "$B/new/$t" >"$out/test_$t.log" 2>&1
    rc=$?; [ $rc = 0 ] || status=1
    echo "test $t (new, full): rc=$rc, $(grep -ciE 'FAIL' "$out/test_$t.log") FAIL lines; $(tail -1 "$out/test_$t.log")"
  done
fi
if has sanitize; then
  for t in test_cuda_mla_sparse test_cuda_mla; do
    KVA_TEST_QUICK=1 timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/new/$t" \
      >"$out/memcheck_$t.log" 2>&1 &
  done
  wait
  for t in test_cuda_mla_sparse test_cuda_mla; do
    grep -q "ERROR SUMMARY: 0 errors" "$out/memcheck_$t.log" || status=1
    echo "memcheck $t quick (new): $(grep -E 'ERROR SUMMARY' "$out/memcheck_$t.log" | tail -1); $(tail -1 "$out/memcheck_$t.log")"
  done
fi
if has bench; then
  sp="--batch 128 --q-len 2 --context 8192 --topk 2048 --iters 20"
  one=("H16 bf16 rows (mma 16-row)|--heads 16 --cache bf16"
       "H32 fp8_ds_mla (mma 32-row)|--heads 32 --cache ds_mla"
       "H32 bf16 rows (mma 32-row)|--heads 32 --cache bf16")
  dense=("dense H16 q1 16k (QR)|--heads 16 --context 16384"
         "dense H16 q2 8k (32-row)|--heads 16 --context 8192 --q-len 2"
         "dense H32 q2 4k mma (64-row)|--heads 32 --context 4096 --q-len 2 --kernel mla_decode_mma_sm80")
  : >"$out/bench_ms.txt"
  [ "${KVA_GC_DENSE:-1}" = 1 ] || dense=()
  for round in $(seq 1 "${KVA_GC_ROUNDS:-2}"); do
    for t in base new; do
      timeout 240 "$B/$t/kvattn" bench --mla-sparse --backend cuda --iters 20 >"$out/sparse_${t}_r$round.log" 2>&1 ||
        { status=1; echo "sparse suite $t r$round: exit $?"; }
      grep -E " ms " "$out/sparse_${t}_r$round.log" | while read -r l; do
        echo "$(echo "${l%%R=*}" | sed 's/ *$//')|$t|$round|$(echo "$l" | grep -oE '[0-9.]+ ms' | awk '{print $1}')|$(echo "$l" | grep -oE 'check [a-zA-Z]+' | awk '{print $2}')"
      done >>"$out/bench_ms.txt"
      for e in "${one[@]}"; do
        l=$(timeout 60 "$B/$t/kvattn" bench --mla-sparse --backend cuda $sp ${e#*|} 2>&1 | tee -a "$out/sparse_one_${t}_r$round.log" | grep -E " ms " | head -1)
        echo "sparse ${e%%|*}|$t|$round|$(echo "$l" | grep -oE '[0-9.]+ ms' | awk '{print $1}')|$(echo "$l" | grep -oE 'check [a-zA-Z]+' | awk '{print $2}')" >>"$out/bench_ms.txt"
      done
      for e in ${dense[@]+"${dense[@]}"}; do
        for kq in none fp8; do
          l=$(timeout 60 "$B/$t/bench_cuda_mla" --batch 128 --block-size 64 --kv-quant $kq ${e#*|} 2>&1 | grep "^bench_cuda_mla:" | head -1)
          echo "$t r$round $kq $l" >>"$out/dense_raw.log"
          echo "${e%%|*} $kq|$t|$round|$(echo "$l" | grep -oE 'median [0-9.]+' | awk '{print $2}')|$(echo "$l" | grep -oE 'check [a-zA-Z]+' | awk '{print $2}')" >>"$out/bench_ms.txt"
        done
      done
    done
  done
  python3 - "$out/bench_ms.txt" <<'EOF' | tee "$out/table.txt"
import sys, collections
d = collections.OrderedDict(); ck = collections.Counter()
for l in open(sys.argv[1]):
    name, t, r, ms, c = l.rstrip('\n').split('|')
    ck[c or 'none'] += 1
    try: d.setdefault(name, {})[(t, int(r))] = float(ms)
    except ValueError: d.setdefault(name, {})
print(f"{'row':44} {'base1':>9} {'new1':>9} {'base2':>9} {'new2':>9} {'new/base':>8}")
for name, v in d.items():
    g = lambda t, r: v.get((t, r), float('nan'))
    rs = sorted({r for (_, r) in v})
    rat = sum(g('new', r) / g('base', r) for r in rs) / max(len(rs), 1)
    print(f"{name[:44]:44} {g('base',1):9.4f} {g('new',1):9.4f} {g('base',2):9.4f} {g('new',2):9.4f} {rat:8.3f}")
print("checks:", dict(ck))
EOF
  # every row's check must say ok (a missing time or check is a failure too)
  awk -F'|' '$5 != "ok" || $4 == ""' "$out/bench_ms.txt" | grep -q . && { status=1; echo "rows without a passing check:"; awk -F'|' '$5 != "ok" || $4 == ""' "$out/bench_ms.txt" | head; }
fi
echo "status $status"
exit $status
