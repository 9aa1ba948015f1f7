#!/usr/bin/env python3
"""perf_table.py - summary of dev/lines38/perf_step.sh output (stdin): per
binary the median samples in the step symbol over rounds, and the median
(min-max) over rounds of the ratio first-binary / this binary (> 1: this one
spends less CPU time in the step)."""
import statistics as st
import sys

runs, order = {}, []
for line in sys.stdin:
    f = line.split()
    if len(f) != 4 or not f[0].startswith("r") or not f[2].isdigit():
        continue
    if f[1] not in runs:
        runs[f[1]] = {}
        order.append(f[1])
    runs[f[1]][f[0]] = int(f[2])
base = runs[order[0]]
print("%-10s %8s   %s" % ("binary", "samples", "base/this (min-max), n"))
for t in order:
    d = runs[t]
    rr = [base[r] / d[r] for r in d if r in base and d[r]]
    print("%-10s %8d   %.3f (%.3f-%.3f) n=%d" % (t, st.median(d.values()), st.median(rr), min(rr), max(rr), len(d)))
