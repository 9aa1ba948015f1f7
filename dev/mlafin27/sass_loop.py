#!/usr/bin/env python3
"""sass_loop.py BASE.o NEW.o: per kernel, SASS instructions (NOPs left out, constants and
register numbers dropped) from the first to the last tensor-core instruction (HMMA / HGMMA:
the key loop) in base and new, and whether that region is the same instruction stream.
CUOBJDUMP names the tool."""
import hashlib, os, re, subprocess, sys

CUOBJDUMP = os.environ.get('CUOBJDUMP', 'cuobjdump')


def loops(obj):
    sass = subprocess.run([CUOBJDUMP, '-sass', obj], capture_output=True, text=True).stdout
    fns, cur = {}, None
    for line in sass.splitlines():
        m = re.search(r'Function : (\S+)', line)
        if m:
            cur = m[1]
            fns[cur] = []
            continue
        m = re.match(r'\s+/\*[0-9a-f]{4,}\*/\s+(.*?);', line)
        if m and cur and not m[1].startswith('NOP'):
            fns[cur].append(re.sub(r'\bU?[RP]\d+\b|0x[0-9a-f]+', 'X', m[1]))
    out = {}
    for k, ins in fns.items():
        t = [i for i, s in enumerate(ins) if re.match(r'(@!?U?P\w+ )?H[G]?MMA', s)]
        reg = ins[t[0]:t[-1] + 1] if t else []
        out[k] = (len(ins), len(reg), hashlib.sha1('\n'.join(reg).encode()).hexdigest()[:10])
    return out


a, b = loops(sys.argv[1]), loops(sys.argv[2])
for k in sorted(set(a) & set(b)):
    if not a[k][1]:
        continue
    name = subprocess.run(['c++filt', k], capture_output=True, text=True).stdout.strip()[:100]
    same = 'same' if a[k][2] == b[k][2] else 'DIFFERS'
    print(f'loop {a[k][1]:5} -> {b[k][1]:5} {same:7} (all {a[k][0]:5} -> {b[k][0]:5}): {name}')
