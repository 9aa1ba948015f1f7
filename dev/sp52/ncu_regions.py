#!/usr/bin/env python3
"""dev/sp52/ncu_regions.py - Nsight Compute's stall samples of one kernel by
code region: the SASS (ncu -i rep --page source --csv --print-source sass)
cut after every barrier, mbarrier, setmaxnreg, exit, bulk copy and
BRA.U.ANY; per region with at least 0.4 % of all samples: its addresses
(last 5 hex digits), instructions, the executions of its last instruction,
its share of all samples, its HMMA / LDS(M) / STS(M) / F2FP counts, its
top 3 stall reasons (% of all samples) and its last instruction.

    python3 dev/sp52/ncu_regions.py sass.csv[.gz]
"""
import csv
import gzip
import re
import sys


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    path = sys.argv[1]
    op = gzip.open if path.endswith(".gz") else open
    rows = list(csv.reader(op(path, "rt", errors="replace")))
    hi = next(i for i, r in enumerate(rows) if "Address" in r and "Source" in r)
    h, d = rows[hi], [r for r in rows[hi + 1:] if len(r) > 3]
    A, SRC = h.index("Address"), h.index("Source")
    S, E = h.index("Warp Stall Sampling (All Samples)"), h.index("Instructions Executed")
    reasons = [(i, c) for i, c in enumerate(h) if c.startswith("stall_") and "Not Issued" not in c]
    tot = sum(num(r[S]) for r in d) or 1.0
    cut = re.compile(r"BAR\.SYNC|BAR\.ARV|SYNCS|USETMAXREG|EXIT|UBLKCP|WARPSYNC|BRA\.U\.ANY")
    segs, cur = [], []
    for r in d:
        cur.append(r)
        if cut.search(r[SRC]):
            segs.append(cur)
            cur = []
    segs.append(cur)
    for s in segs:
        sm = sum(num(r[S]) for r in s)
        if not s or sm / tot < 0.004:
            continue
        per = {}
        for r in s:
            for i, c in reasons:
                per[c] = per.get(c, 0.0) + num(r[i])
        top = sorted(per.items(), key=lambda x: -x[1])[:3]

        def cnt(p):
            return sum(1 for r in s if re.search(p, r[SRC]))

        print("%s-%s n=%4d exec=%7d %5.1f%%  hmma %2d lds %2d sts %2d f2fp %3d | %s | end: %s" % (
            s[0][A][-5:], s[-1][A][-5:], len(s), num(s[-1][E]), 100 * sm / tot, cnt("HMMA"),
            cnt(r"LDS|LDSM"), cnt(r"STS|STSM"), cnt("F2FP"),
            ", ".join("%s %.1f" % (c[6:], 100 * v / tot) for c, v in top), s[-1][SRC].strip()[:48]))


if __name__ == "__main__":
    main()
