#!/usr/bin/env python3
"""dev/sp18/ncu_top.py - where the warps of one kernel wait, from Nsight
Compute's SASS source page as CSV (ncu -i rep --page source --csv
--print-source sass), after dev/mla39/ncu_src.py: the share of all samples
per stall reason, then the top instructions by long-scoreboard samples and
by all samples, each with the instruction (addresses: last 5 hex digits).

    python3 dev/sp18/ncu_top.py sass.csv[.gz] [top]
"""
import collections
import csv
import gzip
import sys


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    op = gzip.open if path.endswith(".gz") else open
    rows = list(csv.reader(op(path, "rt", errors="replace")))
    hi = next(i for i, r in enumerate(rows) if "Address" in r and "Source" in r)
    h, d = rows[hi], [r for r in rows[hi + 1:] if len(r) > 3]
    A, SRC = h.index("Address"), h.index("Source")
    S = h.index("Warp Stall Sampling (All Samples)")
    LS = h.index("stall_long_sb") if "stall_long_sb" in h else None
    reasons = [(i, c) for i, c in enumerate(h) if c.startswith("stall_") and "Not Issued" not in c]
    tot = sum(num(r[S]) for r in d) or 1.0
    per = collections.Counter()
    for r in d:
        for i, c in reasons:
            per[c] += num(r[i])
    print("samples %d; by reason (%% of all): %s" % (tot, ", ".join(
        "%s %.1f" % (c[6:], 100 * v / tot) for c, v in per.most_common(8))))
    if LS is not None:
        ls = sum(num(r[LS]) for r in d) or 1.0
        print("top by long_sb (% of long_sb | % of all), instruction:")
        for r in sorted(d, key=lambda r: -num(r[LS]))[:top]:
            print("  %5.1f | %4.1f  %s  %s" % (100 * num(r[LS]) / ls, 100 * num(r[S]) / tot,
                                             r[A][-5:], r[SRC].strip()[:90]))
    print("top by all samples (% of all), instruction:")
    for r in sorted(d, key=lambda r: -num(r[S]))[:top]:
        print("  %4.1f  %s  %s" % (100 * num(r[S]) / tot, r[A][-5:], r[SRC].strip()[:90]))


if __name__ == "__main__":
    main()
