#!/usr/bin/env python3
"""perf_loops.py - where the samples of one function fall, by innermost loop: the
loops are found in its objdump (backward jumps), each sample address of perf
annotate goes to the smallest loop holding it; a loop is tagged PV (vbroadcastss
and vpmovsxbd: the int8 P.V key loop), scores, pf (prefetches) or softmax?.
Usage: python3 dev/lines38/perf_loops.py BINARY SYMBOL PERF_DATA"""
import re
import subprocess
import sys

b,sym,data=sys.argv[1:4]
dis=subprocess.run(["objdump","-d","--no-show-raw-insn",b],capture_output=True,text=True).stdout
ins=[];on=False
for l in dis.splitlines():
    if l.endswith("<%s>:"%sym): on=True; continue
    if on and not l.strip(): break
    if on:
        m=re.match(r'\s*([0-9a-f]+):\s*(.*)',l)
        if m: ins.append((int(m.group(1),16),m.group(2)))
ann=subprocess.run(["perf","annotate","-i",data,"--stdio","-s",sym],capture_output=True,text=True).stdout
pct={}
for l in ann.splitlines():
    m=re.match(r'\s+([0-9.]+)\s*:\s+([0-9a-f]+):',l)
    if m: pct[int(m.group(2),16)]=float(m.group(1))
loops=[]
for a,t in ins:
    m=re.match(r'(j\w+)\s+([0-9a-f]+)',t)
    if m and int(m.group(2),16)<a: loops.append((int(m.group(2),16),a))
# innermost attribution: smallest loop containing address
tot={}
for a,p in pct.items():
    best=None
    for lo,hi in loops:
        if lo<=a<=hi and (best is None or hi-lo<best[1]-best[0]): best=(lo,hi)
    tot[best]=tot.get(best,0)+p
def kind(lo,hi):
    body=[t for a,t in ins if lo<=a<=hi]
    s=" ".join(body)
    k=[]
    if 'vbroadcastss' in s and 'vpmovsxbd' in s: k.append("PV")
    elif 'vpmovsxbd' in s: k.append("scores")
    if 'prefetch' in s: k.append("pf")
    if 'vblendv' in s or 'vmaxps' in s: k.append("softmax?")
    return "%d ins %s"%(len(body)," ".join(k))
for k,v in sorted(tot.items(),key=lambda x:-x[1])[:14]:
    print("%6.2f%%  %s  %s"%(v, "%x-%x"%k if k else "no loop", kind(*k) if k else ""))
