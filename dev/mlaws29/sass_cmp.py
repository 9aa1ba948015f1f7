#!/usr/bin/env python3
"""sass_cmp.py A.sass B.sass [NAME_PART] - compare two `cuobjdump -sass` dumps of
the same object, kernel by kernel (optionally only kernels whose mangled name
contains NAME_PART): instruction counts, whether the instruction text
(encodings dropped) is identical, per-opcode count differences, and the first
differing lines."""
import collections
import re
import sys


def funcs(path):
    d, cur = {}, None
    for line in open(path):
        m = re.match(r'\s+Function : (\S+)', line)
        if m:
            cur = m.group(1)
            d[cur] = []
            continue
        if cur is not None:
            m = re.match(r'\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;?\s*/\*', line)
            if m:
                d[cur].append(m.group(2).rstrip(' ;'))
    return d


def short(k):
    return (('bf16' if 'bf16' in k else 'f16') + ('_dense' if 'dense' in k else '_sparse') +
            ('_fp8' if 'Lb1' in k else '_16bit'))


def opcodes(lines):
    return collections.Counter(i.split()[1] if i.startswith('@') else i.split()[0] for i in lines)


a, b = funcs(sys.argv[1]), funcs(sys.argv[2])
only = sys.argv[3] if len(sys.argv) > 3 else ''
for k in sorted(a):
    if only not in k:
        continue
    x, y = a[k], b.get(k, [])
    cx, cy = opcodes(x), opcodes(y)
    dop = {m: (cx[m], cy[m]) for m in set(cx) | set(cy) if cx[m] != cy[m]}
    nd = sum(1 for i, j in zip(x, y) if i != j) + abs(len(x) - len(y))
    if len(dop) > 8:  # a different kernel: name only the MMA, spill and barrier opcodes
        dop = {m: v for m, v in dop.items() if re.match(r'HGMMA|LDL|STL|BAR', m)}
        dop['(other opcodes differ)'] = ''
    print(f"{short(k):18s} {len(x)} vs {len(y)} instructions; identical: {x == y}; "
          f"differing lines: {nd}; opcode count diffs: {dop if dop else 'none'}")
    if nd < 20:
        for i, j in [(i, j) for i, j in zip(x, y) if i != j][:3]:
            print(f"    {i}  |  {j}")
