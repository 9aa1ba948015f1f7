"""walk.py LIST START END TAKEN... : follow the SASS listing from START until END (exclusive) is reached;
conditional branches at the addresses in TAKEN are taken, all others fall through; unconditional BRA
followed. Prints instruction counts by class and the total."""
import sys, re, collections
lst = {}
order = []
for l in open(sys.argv[1]):
    p = l.split(None, 1)
    a = int(p[0], 16); lst[a] = p[1].strip(); order.append(a)
nxt = {a: b for a, b in zip(order, order[1:])}
start, end = int(sys.argv[2], 16), int(sys.argv[3], 16)
taken = set(int(x, 16) for x in sys.argv[4:])
CLS = [('HGMMA','HGMMA'),('FFMA','FFMA'),('FMUL','FMUL'),('FADD','FADD'),('FMNMX','FMNMX'),('MUFU','MUFU'),
       ('F2FP','F2FP(cvt)'),('FSETP','FSETP/FSEL'),('FSEL','FSETP/FSEL'),('SHFL','SHFL'),('STSM','STSM'),('STS','STS'),('LDS','LDS'),
       ('BAR','BAR'),('WARPGROUP','WARPGROUP'),('SYNCS','SYNCS'),('UTMALDG','TMA'),('BRA','BRA'),('BSSY','BSSY/BSYNC'),
       ('BSYNC','BSSY/BSYNC'),('WARPSYNC','WARPSYNC'),('MEMBAR','fence'),('FENCE','fence'),('LDG','LDG'),
       ('U','uniform'),('R2UR','uniform'),('S2UR','uniform'),('IMAD','int'),('IADD','int'),('LOP3','int'),('LEA','int'),('SHF','int'),('ISETP','int'),
       ('MOV','int'),('SEL','int'),('VIADD','int'),('VIMNMX','int'),('PLOP3','int'),('NOP','nop')]
def cls(ins):
    op = re.sub(r'^@!?U?P\w+\s+', '', ins).split()[0]
    for p, c in CLS:
        if op.startswith(p): return c
    return 'other:' + op
cnt = collections.Counter(); a = start; n = 0; path = []
while a != end:
    ins = lst[a]; c = cls(ins); cnt[c] += 1; n += 1; path.append((a, ins))
    if n > 5000: print('loop?'); break
    m = re.match(r'^(@!?U?P\w+\s+)?BRA(\.\w+)*\s+(?:U?!?P\d,\s*)?(0x[0-9a-f]+)', ins)
    if m and 'BRA.DIV' not in ins and 'BRA.U.ANY' not in ins:
        tgt = int(m.group(3), 16)
        if m.group(1) is None or a in taken:
            a = tgt; continue
    a = nxt[a]
if '-v' in sys.argv[0:1]: pass
for k, v in sorted(cnt.items(), key=lambda x: -x[1]): print(f'{k:12s} {v}')
print('total', n)
