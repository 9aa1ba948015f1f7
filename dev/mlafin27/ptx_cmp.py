#!/usr/bin/env python3
"""ptx_cmp.py BASE.o NEW.o: per kernel of two objects' embedded PTX (cuobjdump -ptx;
CUOBJDUMP names the tool), with register numbers and labels dropped: identical, or how many
instructions differ (a difflib alignment) before the kernel's first tensor-core instruction
(mma.sync / wgmma: the item's set-up), between its first and last (the key loop) and after
(the end of the item: row sums, stores)."""
import difflib, os, re, subprocess, sys

CUOBJDUMP = os.environ.get('CUOBJDUMP', 'cuobjdump')


def kernels(obj):
    ptx = subprocess.run([CUOBJDUMP, '-ptx', obj], capture_output=True, text=True).stdout
    out, cur = {}, None
    for line in ptx.splitlines():
        m = re.match(r'\.(?:visible )?\.entry (\S+)\(', line)
        if m:
            cur = m[1]
            out[cur] = []
            continue
        s = line.strip()
        if cur is None or not s or s.startswith(('//', '.reg', '.loc', '.pragma')):
            continue
        out[cur].append(s)
    return out


def canon(lines):
    """Register numbers and labels dropped: what is left is the instruction stream (a
    renumbering or a moved label is no difference; a moved instruction is)."""
    res = []
    for s in lines:
        s = re.sub(r'_param_\d+', '_param', s)
        res.append(re.sub(r'\$L__\w+', 'L', re.sub(r'%(r|rd|f|fd|p|rs|h|hh)\d+', r'%\1', s)))
    return res


def demangle(n):
    return subprocess.run(['c++filt', n], capture_output=True, text=True).stdout.strip()


a, b = kernels(sys.argv[1]), kernels(sys.argv[2])
for k in sorted(set(a) | set(b)):
    name = demangle(k)[:110]
    if k not in a or k not in b:
        print(f'{"only new" if k in b else "only base"}: {name}')
        continue
    x, y = canon(a[k]), canon(b[k])
    if x == y:
        print(f'identical ({len(x)} lines): {name}')
        continue
    mma = [i for i, s in enumerate(x) if s.startswith(('mma.sync', 'wgmma.mma_async'))]
    lo, hi = (mma[0], mma[-1]) if mma else (0, -1)
    ops = [o for o in difflib.SequenceMatcher(None, x, y, autojunk=False).get_opcodes()
           if o[0] != 'equal']
    nd = sum(max(i2 - i1, j2 - j1) for _, i1, i2, j1, j2 in ops)
    # base lines changed (or the insertion points) from the first to the last mma: the key loop
    inloop = sum(max(i2 - i1, j2 - j1) for _, i1, i2, j1, j2 in ops if i1 <= hi and i2 > lo)
    pre = sum(max(i2 - i1, j2 - j1) for _, i1, i2, j1, j2 in ops if i2 <= lo)
    print(f'differs: {nd} lines ({pre} before the first mma, {inloop} between the first and the '
          f'last of its {len(mma)} mma, {nd - pre - inloop} after; {len(x)} -> {len(y)}): {name}')
