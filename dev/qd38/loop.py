#!/usr/bin/env python3
"""loop.py CUBIN [CUBIN2]: the key loop of the decode kernel in CUBIN (sm_90a), found as the
backward branch whose range holds the most HMMA instructions (static: every path of the loop
body counted, the general copy path included), with its opcode counts; with CUBIN2 both side by
side (opcodes whose count differs). NVDISASM: the disassembler (default nvdisasm on PATH)."""
import collections, os, re, subprocess, sys
NVDISASM = os.environ.get('NVDISASM', 'nvdisasm')
def loop(path):
    txt = subprocess.run([NVDISASM, '-c', path], capture_output=True, text=True).stdout
    ins = []  # (addr, opcode, text)
    labels, pend = {}, []
    for line in txt.splitlines():
        ml = re.match(r'^(\.L_x_\d+):', line.strip())
        if ml: pend.append(ml[1]); continue
        m = re.match(r'\s+/\*([0-9a-f]{4,})\*/\s+(.*?);', line)
        if not m: continue
        t = m[2].strip()
        op = re.sub(r'^@!?U?P[T0-6] ', '', t).split(' ')[0]
        if op.startswith('NOP'): continue
        for l in pend: labels[l] = int(m[1], 16)
        pend = []
        ins.append((int(m[1], 16), op, t))
    best = None
    for i, (a, op, t) in enumerate(ins):
        if op.split('.')[0] != 'BRA': continue
        m = re.search(r'`\((\.L_x_\d+)\)', t)
        tgt = labels.get(m[1]) if m else None
        if tgt is None or tgt >= a: continue
        body = [x for x in ins if tgt <= x[0] <= a]
        n = sum(1 for x in body if x[1].startswith('HMMA'))
        if best is None or n > best[0] or (n == best[0] and len(body) < len(best[1])):
            best = (n, body)
    body = best[1] if best else []
    c = collections.Counter(x[1] for x in body)
    return len(body), c
def main():
    res = [loop(p) for p in sys.argv[1:]]
    for p, (n, c) in zip(sys.argv[1:], res):
        print(f'{os.path.basename(p)}: key loop {n} instructions, HMMA {c["HMMA.16816.F32"] + c["HMMA.16816.F32.BF16"]}')
    if len(res) == 1:
        for op, k in res[0][1].most_common(30): print(f'  {op:24s} {k}')
    else:
        ops = sorted(set(res[0][1]) | set(res[1][1]), key=lambda o: -max(res[0][1][o], res[1][1][o]))
        for op in ops:
            a, b = res[0][1][op], res[1][1][op]
            if a != b or a >= 40: print(f'  {op:24s} {a:5d} {b:5d} {b - a:+5d}')
main()
