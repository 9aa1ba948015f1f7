# dev/cpumla2/summ.py LOG: medians over the rounds of ab.sh rows (x = speed-up vs the first binary).
import sys,re,statistics as st
rows={}
for l in open(sys.argv[1]):
    if not l.startswith('ROW'): continue
    f=l.split(); key=(f[1],f[2],f[3]); b=f[4]
    rows.setdefault(key,{}).setdefault(b,[]).append((float(f[6]),float(f[8]),float(f[10]),float(f[12]),float(f[13])))
for key,d in rows.items():
    base=None
    for b,v in d.items():
        med=st.median(x[0] for x in v); cpu=st.median(x[2] for x in v); gb=st.median(x[3] for x in v); gf=st.median(x[4] for x in v)
        if base is None: base=(med,cpu)
        print("%-5s %-4s %-3s %-5s wall med %7.3f ms (%s) cpu/call %7.2f ms (%s) | %5.2f GB/s %6.1f GFLOP/s | x%.2f wall x%.2f cpu vs first" % (key+(b,med," ".join("%.2f"%x[0] for x in v),cpu," ".join("%.2f"%x[2] for x in v),gb,gf,base[0]/med,base[1]/cpu)))
