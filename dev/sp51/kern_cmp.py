#!/usr/bin/env python3
"""dev/sp51/kern_cmp.py BASE.o NEW.o: per kernel of two CUDA objects (sm_90a), whether its SASS
is identical (cuobjdump -sass, addresses and encodings dropped), its instruction count, registers
and stack (cuobjdump -res-usage), and its LDGSTS / UBLKCP / BAR / SYNCS counts. CUOBJDUMP: a
cuobjdump (the VM's CUDA bin has none; triton's copy reads sm_90a)."""
import os, re, subprocess, sys

CU = os.environ.get('CUOBJDUMP',
                    '/work/venv-api41/lib/python3.11/site-packages/triton/backends/nvidia/bin/cuobjdump')


def load(obj):
    sass, res, f = {}, {}, None
    for line in subprocess.run([CU, '-sass', obj], capture_output=True, text=True).stdout.splitlines():
        m = re.search(r'Function : (\S+)', line)
        if m:
            f = m.group(1)
            sass[f] = []
            continue
        m = re.match(r'\s+/\*[0-9a-f]{4}\*/\s+(.*?;)', line)
        if f and m:
            sass[f].append(m.group(1))
    for line in subprocess.run([CU, '-res-usage', obj], capture_output=True, text=True).stdout.splitlines():
        m = re.search(r'Function (\S+):', line)
        if m:
            f = m.group(1)
            continue
        m = re.search(r'REG:(\d+) STACK:(\d+)', line)
        if m and f:
            res[f] = (int(m.group(1)), int(m.group(2)))
    return sass, res


def count(ins, op):
    return sum(1 for i in ins if re.search(r'\b' + op, i))


bs, br = load(sys.argv[1])
ns, nr = load(sys.argv[2])
for f in sorted(ns):
    b, n = bs.get(f), ns[f]
    st = 'same' if b == n else 'CHANGED'
    cols = ' '.join('%s %s -> %s,' % (op, count(b, op) if b else '-', count(n, op))
                    for op in ('LDGSTS', 'UBLKCP', 'BAR.SYNC', 'SYNCS'))
    print('%-7s %5s -> %5s instr, regs %s -> %s, %s %s' %
          (st, len(b) if b else '-', len(n), br.get(f), nr.get(f), cols, f))
