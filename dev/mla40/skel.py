import sys,re
prev=None
for l in open(sys.argv[1]):
    a,ins=l.split(None,1); ins=ins.strip()
    if 'HGMMA' in ins:
        k='HGMMA' + (' RS' if re.search(r'HGMMA\S+ R\d+, R\d+, gdesc', ins) else '')
        if prev==k: continue
        prev=k; print(a,ins); continue
    prev=None
    if re.search(r'BRA|BAR|WARPGROUP|SYNCS|EXIT|STSM|VOTE|SHFL|BSSY|BSYNC|UTMALDG|LDG',ins) and 'BRA.U.ANY' not in ins:
        print(a,ins)
