#!/usr/bin/env bash
# cpu_faults.sh BUILD LIBDIR: planted faults for tests/cuda/test_cuda_nan.c's
# KVA_TEST_NAN_CPU=1 mode. Copies the CPU finals (cpu_item.c, cpu_merge.c,
# prefill_tiled.inc) into BUILD/faults/, plants one fault at a time,
# compiles the objects with LIBDIR's (a CMake build of the same tree)
# commands, puts them into a copy of LIBDIR/libkvattn.a, links the test
# (dev/mhanan44/link.sh) against it and runs it in CPU mode, quick. Each
# fault must FAIL. Faults:
#   F1 drop: a NaN final row becomes out 0, lse -inf (the pattern of the
#      old CUDA MLA chunk merge), in the item finals, the split merge and
#      the prefill tiles;
#   F2 merge: the split merge leaves out NaN parts (fmaxf, skip) - only
#      rows of split tasks;
#   F3 neginf: a row whose every score is -inf (no sink) gets lse 0;
#   F4 velem: a NaN out element of a row with finite lse becomes 0;
#   F5 int8: kva__quant_check_rows finds no NaN (src/cache/quant.c): int8
#      writes of NaN rows go through.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd); b=$(cd "$1" && pwd); L=$(cd "$2" && pwd)
f=$b/faults; rm -rf "$f"; mkdir -p "$f"
cmd_of() { # source path (src/...) -> its compile command, rewritten to compile $f/src/NAME
  local c n=${1##*/} d=${1%/*}; c=$(ninja -C "$L" -t commands "CMakeFiles/kvattn_obj.dir/$1.o" | tail -1)
  c=${c//" -MD -MT CMakeFiles/kvattn_obj.dir/$1.o -MF CMakeFiles/kvattn_obj.dir/$1.o.d"/}
  c=${c//"-o CMakeFiles/kvattn_obj.dir/$1.o"/"-o $f/$n.o"}
  c=${c//"-c /work/main/$1"/"-I$root/$d -I$f/src -c $f/src/$n"}
  c=${c//"/work/main/"/"$root/"}
  echo "$c"
}
plant() { # fault name
  rm -rf "$f/src"; mkdir -p "$f/src"
  cp "$root/src/attn/cpu/cpu_item.c" "$root/src/attn/cpu/cpu_merge.c" \
     "$root/src/attn/cpu/prefill_tiled.inc" "$root/src/cache/quant.c" "$f/src/"
  python3 - "$f/src" "$1" <<'PY'
import sys, re
d, name = sys.argv[1], sys.argv[2]
def edit(fn, old, new, count=1):
    p = d + '/' + fn; s = open(p).read()
    assert s.count(old) >= count, (fn, old)
    s = s.replace(old, new); open(p, 'w').write(s)
stores = [('cpu_item.c', 'acc', '        kva__cpu_store_row((unsigned char *)run->out + (size_t)(row * Dv) * esz, run->dt, acc, Dv);'),
          ('cpu_merge.c', 'acc', '        kva__cpu_store_row((unsigned char *)run->out + (size_t)(row * Dv) * esz, run->dt, acc, Dv);'),
          ('prefill_tiled.inc', 'row', '        kva__cpu_store_row((unsigned char *)run->out + (size_t)(orow * Dv) * esz, run->dt, row, Dv);')]
if name == 'drop':
    for fn, a, st in stores:
        edit(fn, st, '        if (lse != lse) { for (int32_t z = 0; z < Dv; z++) %s[z] = 0.0f; lse = -INFINITY; }\n' % a + st)
elif name == 'velem':
    for fn, a, st in stores:
        edit(fn, st, '        if (lse == lse) for (int32_t z = 0; z < Dv; z++) if (%s[z] != %s[z]) %s[z] = 0.0f;\n' % (a, a, a) + st)
elif name == 'merge':
    edit('cpu_merge.c', 'top = kva__cpu_max_nan(base[c * split_floats + (int64_t)M * Dv + m], top);',
         'top = fmaxf(base[c * split_floats + (int64_t)M * Dv + m], top);')
    edit('cpu_merge.c', 'if (l == -INFINITY)\n                    continue;', 'if (l == -INFINITY || l != l)\n                    continue;')
elif name == 'neginf':
    for fn in ('cpu_item.c', 'prefill_tiled.inc'):
        p = d + '/' + fn; s = open(p).read()
        s2 = re.sub(r'(\} else if \(l == 0\.0f\) \{\s*f = 0\.0f;\s*lse = )-INFINITY;', r'\g<1>0.0f;', s)
        assert s2 != s, fn; open(p, 'w').write(s2)
    edit('cpu_merge.c', 'float W = 0.0f, lse = -INFINITY;', 'float W = 0.0f, lse = 0.0f;')
elif name == 'int8':
    edit('quant.c', '    float x[KVA_MAX_HEAD_DIM];\n    const size_t es', '    if (n > 0)\n        return -1;\n    float x[KVA_MAX_HEAD_DIM];\n    const size_t es')
PY
}
rc_all=0
for name in drop merge neginf velem int8; do
  plant $name || { echo "$name: plant failed"; rc_all=1; continue; }
  objs=""
  for o in attn/cpu/cpu_item.c attn/cpu/cpu_merge.c attn/cpu/prefill_avx2.c \
           attn/cpu/prefill_avx512.c attn/cpu/prefill_avx512_bf16.c cache/quant.c; do
    [ -f "$f/src/${o##*/}" ] || cp "$root/src/$o" "$f/src/"
    eval "nice $(cmd_of src/$o)" || { echo "$name: compile $o failed"; rc_all=1; }
    objs="$objs ${o##*/}.o"
  done
  cp "$L/libkvattn.a" "$f/libkvattn.a" && (cd "$f" && ar r libkvattn.a $objs 2>/dev/null)
  # ar r replaces members by basename: the library's members are named FILE.c.o too
  LIB=$f/libkvattn.a OUTBIN=$f/test_cuda_nan_$name bash "$root/dev/mhanan44/link.sh" >/dev/null || { echo "$name: link failed"; rc_all=1; continue; }
  KVA_TEST_QUICK=1 KVA_TEST_NAN_CPU=1 "$f/test_cuda_nan_$name" >"$f/$name.log" 2>&1; rc=$?
  echo "fault $name: rc=$rc (must be nonzero); $(grep -c 'CHECK failed\|returned KVA' "$f/$name.log") failed checks; $(grep -E '^[0-9]+ passed' "$f/$name.log")"
  grep -E "CHECK failed" "$f/$name.log" | head -4 | sed 's/^/    /'
  [ $rc = 0 ] && rc_all=1
done
exit $rc_all
