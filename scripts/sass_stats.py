#!/usr/bin/env python3
"""sass_stats.py OBJ...: per prefill kernel (mma.sync or wgmma), tensor-core decode kernel
(decode_mma_kernel) and MLA mma.sync / wgmma kernel (dense and sparse) in the objects' device code (compile
them for one architecture, e.g. sm_90a): a key from its template arguments (the same for
main's per-kernel templates and the one body's policies, so two listings can be compared
line by line), SASS instruction count (NOPs left out), registers, stack, shared memory,
memory / spill / mma / MUFU / barrier-shuffle-vote instruction counts, and a hash of the
instruction stream without constants (equal hash = identical code).
CUOBJDUMP: the cuobjdump to use (default: cuobjdump on PATH)."""
import hashlib, os, re, subprocess, sys
CUOBJDUMP = os.environ.get('CUOBJDUMP', 'cuobjdump')
def demangle(n):
    return subprocess.run(['c++filt', n], capture_output=True, text=True).stdout.strip()
def key(d):
    # old: prefill_mma_kernel<128, 64, 4, 2, 1, kva__mma_bf16>(...)
    #      prefill_mma_quant_kernel<128, 64, 4, 2, 1, 0, false, kva__mma_bf16>(...)
    # new: prefill_mma_kernel<pf16_policy<128, kva__mma_bf16> >(...)
    #      prefill_mma_kernel<qp_policy<128, 64, 4, 2, 1, 0, false, kva__mma_bf16> >(...)
    m = re.match(r'void prefill_mma_kernel<pf16_policy<(\d+), (\w+)> *>', d)
    if m: return f'16bit D{m[1]} {m[2]}'
    m = re.match(r'void prefill_mma_kernel<(\d+), \d+, \d+, \d+, \d+, (\w+)>', d)
    if m: return f'16bit D{m[1]} {m[2]}'
    m = re.match(r'void prefill_mma(?:_quant)?_kernel<(?:qp_policy<)?(\d+), (\d+), (\d+), (\d+), (\d+), (\d+), (\w+), (\w+)>', d)
    if m: return f'quant fmt{m[6]} D{m[1]} BN{m[2]} NW{m[3]} LO={m[7]} {m[8]}'
    # wgmma: prefill_wgmma_ws_kernel<true, true, kva__mma_bf16, 128, 128>(...)
    # decode: decode_mma_kernel<qm_load<0, __nv_bfloat16, 128> >(...), dm_load16<kva__mma_bf16, 128>
    m = re.match(r'void decode_mma_kernel<qm_load<(?:\(int\))?(\d+), (\w+), (?:\(int\))?(\d+)>', d)
    if m: return f'decode quant fmt{m[1]} D{m[3]} q {m[2]}'
    m = re.match(r'void decode_mma_kernel<dm_load16<(\w+), (?:\(int\))?(\d+)>', d)
    if m: return f'decode 16bit D{m[2]} {m[1]}'
    # (tile shape NCW, BN after the head sizes since branch pf7: "narrow" for 1, 64; none = wide)
    m = re.match(r'void prefill_wgmma_ws_kernel<(?:\(bool\))?(\w+), (?:\(bool\))?(\w+), (\w+), (?:\(int\))?(\d+), (?:\(int\))?(\d+)(?:, (?:\(int\))?(\d+), (?:\(int\))?(\d+))?>', d)
    if m: return f'wgmma {"TMA" if m[2] in ("true", "1") else "cp.async"} {m[4]}/{m[5]}{" narrow" if m[6] == "1" else ""} {m[3]}'
    # MLA mma.sync: old mla_decode_mma_kernel<kva__mma_bf16, 1, true, false> (dense, FP8 last) and
    # mla_sparse_kernel<kva__mma_bf16, 2, sp_ds_mla>; new (one body, since mlasp27):
    # mla_decode_mma_kernel<kva__mma_bf16, 1, true, ml_dense<kva__mma_bf16, false> > and
    # mla_decode_mma_kernel<kva__mma_bf16, 2, false, sp_mma<kva__mma_bf16, sp_ds_mla> >
    m = re.match(r'void mla_decode_mma_kernel<(\w+), (?:\(int\))?(\d), (?:\(bool\))?(\w+), (?:\(bool\))?(true|false|1|0)>', d) or \
        re.match(r'void mla_decode_mma_kernel<(\w+), (?:\(int\))?(\d), (?:\(bool\))?(\w+), ml_dense<\w+, (?:\(bool\))?(\w+)> *>', d)
    if m: return f'mla mma dense {"fp8" if m[4] in ("true", "1") else "16bit"} MT{m[2]} QR={m[3]} {m[1]}'
    m = re.match(r'void mla_sparse_kernel<(\w+), (?:\(int\))?(\d), (\w+)>', d) or \
        re.match(r'void mla_decode_mma_kernel<(\w+), (?:\(int\))?(\d), (?:\(bool\))?\w+, sp_mma<\w+, (\w+)> *>', d)
    if m: return f'mla mma sparse {m[3]} MT{m[2]} {m[1]}'
    return d[:80]
stats = {}
for obj in sys.argv[1:]:
    res = subprocess.run([CUOBJDUMP, '-res-usage', obj], capture_output=True, text=True).stdout
    cur = None
    for line in res.splitlines():
        m = re.search(r'Function (\S+):', line)
        if m: cur = m[1]; continue
        m = re.search(r'REG:(\d+) STACK:(\d+) SHARED:(\d+)', line)
        if m and cur: stats.setdefault(cur, {})['res'] = (int(m[1]), int(m[2]), int(m[3]))
    sass = subprocess.run([CUOBJDUMP, '-sass', obj], capture_output=True, text=True).stdout
    cur = None
    for line in sass.splitlines():
        m = re.search(r'Function : (\S+)', line)
        if m: cur = m[1]; stats.setdefault(cur, {}).setdefault('ins', []); continue
        m = re.match(r'\s+/\*[0-9a-f]{4,}\*/\s+(.*?);', line)
        if m and cur: stats[cur]['ins'].append(re.sub(r'0x[0-9a-f]+', 'X', m[1]))
for f, s in sorted(stats.items(), key=lambda kv: key(demangle(kv[0]))):
    d = demangle(f)
    if not any(k in d for k in ('prefill_mma', 'prefill_wgmma', 'decode_mma_kernel', 'mla_')): continue
    ins = [i for i in s.get('ins', []) if not i.startswith('NOP')]
    h = hashlib.sha1('\n'.join(ins).encode()).hexdigest()[:10]
    r = s.get('res', (0, 0, 0))
    op = [re.sub(r'^@!?U?P[T0-6] ', '', i).split(' ')[0] for i in ins]
    cls = lambda pat: sum(1 for o in op if re.match(pat, o))
    mem = cls(r'(LDG|STG|LDS|STS|LDSM|LDGSTS|LDC|ATOM|RED)\b')
    spill = cls(r'(STL|LDL)\b')
    mma = cls(r'H?G?MMA')
    sfu = cls(r'MUFU')
    sync = cls(r'(BAR|DEPBAR|LDGDEPBAR|SHFL|VOTE)')
    print(f'{key(d):50s} ins {len(ins):6d} reg {r[0]:3d} stack {r[1]:4d} smem {r[2]:5d} '
          f'mem {mem:4d} spill {spill:3d} mma {mma:4d} sfu {sfu:3d} sync {sync:3d} {h}')
