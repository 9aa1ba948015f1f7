#!/usr/bin/env python3
"""perf_rows_table.py - summary of dev/lines38/perf_rows.sh output (stdin):
per row and binary the median step samples and min ms over rounds, and the
median (min-max) over rounds of first-binary / this-binary for the step
samples (> 1: this binary spends less CPU time in the steps) and for the
fastest iteration (> 1: faster)."""
import statistics as st
import sys

rows, order = {}, []
for line in sys.stdin:
    f = line.split()
    if len(f) != 8 or not f[0].startswith("r") or not f[4].isdigit():
        continue
    key = (f[1], f[2])
    if key not in rows:
        rows[key] = {}
        order.append(key)
    rows[key].setdefault(f[3], {})[f[0]] = (int(f[4]), float(f[7]))
print("%-11s %-14s %-8s %8s %8s   %-24s %s" % ("isa", "shape", "binary", "samples", "min ms",
                                              "samples base/this", "min-ms base/this"))
for key in order:
    tags = list(rows[key])
    base = rows[key][tags[0]]
    for t in tags:
        d = rows[key][t]
        rs = [base[r][0] / d[r][0] for r in d if r in base and d[r][0]]
        rm = [base[r][1] / d[r][1] for r in d if r in base and d[r][1]]
        print("%-11s %-14s %-8s %8d %8.2f   %.3f (%.3f-%.3f)    %.3f (%.3f-%.3f)  n=%d" % (
            key[0], key[1], t, st.median(v[0] for v in d.values()), st.median(v[1] for v in d.values()),
            st.median(rs), min(rs), max(rs), st.median(rm), min(rm), max(rm), len(d)))
