#!/usr/bin/env python3
"""dev/cpusp27/summ.py LOG: medians over the rounds of ab.sh's rows (time, GB/s, paired read %,
read ceiling), per cache format, thread count and binary."""
import re, sys, statistics as st
rows = {}
for line in open(sys.argv[1]):
    if not line.startswith("ROW "):
        continue
    _, cache, t, label, rest = line.split(" ", 4)
    m = re.search(r"time median ([\d.]+) ms", rest)
    g = re.search(r"-> ([\d.]+) GB/s", rest)
    p = re.search(r"paired read: ([\d.]+)%", rest)
    c = re.search(r"ceilings: read ([\d.]+) GB/s", rest)
    k = re.search(r"kernel (\w+)", rest)
    ok = "check vs ref (request 0): ok" in rest
    d = rows.setdefault((cache, t, label), {"ms": [], "gbs": [], "pr": [], "ceil": [], "ok": [], "k": ""})
    if m: d["ms"].append(float(m.group(1)))
    if g: d["gbs"].append(float(g.group(1)))
    if p: d["pr"].append(float(p.group(1)))
    if c: d["ceil"].append(float(c.group(1)))
    d["ok"].append(ok)
    d["k"] = k.group(1) if k else "?"
print("| cache | threads | binary | kernel | ms median (runs) | GB/s | paired read % | read ceiling GB/s (range) | checks |")
print("|---|---|---|---|---|---|---|---|---|")
for (cache, t, label), d in rows.items():
    med = lambda v: st.median(v) if v else float("nan")
    rng = f"{min(d['ceil']):.1f}-{max(d['ceil']):.1f}" if d["ceil"] else "-"
    print(f"| {cache} | {t[1:]} | {label} | {d['k']} | {med(d['ms']):.2f} ({', '.join(f'{x:.2f}' for x in d['ms'])}) | "
          f"{med(d['gbs']):.2f} | {med(d['pr']):.1f} | {rng} | {sum(d['ok'])}/{len(d['ok'])} ok |")
