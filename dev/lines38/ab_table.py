#!/usr/bin/env python3
"""ab_table.py - summary of dev/lines38/ab_rows.sh output (stdin): per row and
binary the median over rounds of the median ms, the min ms and the paired
fraction, and the median (min-max) over rounds of each binary's per-round
ratio of time to the first binary's (min ms: first / this, so > 1 is faster
than the first binary; paired: this / first)."""
import statistics as st
import sys

rows = {}
order = []
for line in sys.stdin:
    f = line.split()
    if len(f) != 7 or not f[0].startswith("r"):
        continue
    r, isa, shape, tag, med, mn, paired = f
    key = (isa, shape)
    if key not in rows:
        rows[key] = {}
        order.append(key)
    if tag not in rows[key]:
        rows[key][tag] = {}
    rows[key][tag][r] = (float(med), float(mn), float(paired.rstrip("%")))

print("%-11s %-14s %-10s %8s %8s %7s   %-22s %-22s" %
      ("isa", "shape", "tag", "med ms", "min ms", "paired", "min ratio (min-max)", "paired ratio (min-max)"))
for key in order:
    tags = list(rows[key])
    base = rows[key][tags[0]]
    for tag in tags:
        d = rows[key][tag]
        rm = [base[r][1] / d[r][1] for r in d if r in base]
        rp = [d[r][2] / base[r][2] for r in d if r in base]
        print("%-11s %-14s %-10s %8.3f %8.3f %6.1f%%   %.3f (%.3f-%.3f)    %.3f (%.3f-%.3f)  n=%d" % (
            key[0], key[1], tag, st.median(v[0] for v in d.values()), st.median(v[1] for v in d.values()),
            st.median(v[2] for v in d.values()), st.median(rm), min(rm), max(rm), st.median(rp), min(rp),
            max(rp), len(d)))
