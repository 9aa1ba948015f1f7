#!/usr/bin/env python3
"""dev/mla50/regions.py - the warp samples of Nsight Compute's SASS source
page (CSV, as dev/mla39/ncu_src.py reads it) summed per code region and wait
of the bf16 TMA MLA wgmma kernel of device call 1 (main 375cdfe built by
dev/mla50/side.sh; the addresses are that binary's, last 5 hex digits):

    python3 dev/mla50/regions.py src_base_sass.csv.gz
"""
import collections
import csv
import gzip
import sys

# [lo, hi) address ranges of the kernel's regions and the labelled waits
REGIONS = [(0x00000, 0xb3720, "item prologue: start, item load"),
           (0xb3720, 0xb4000, "item prologue: kva__dmma_rows' row loop (64 steps)"),
           (0xb4000, 0xb5100, "item prologue: first TMA tiles"),
           (0xb5100, 0xb70d0, "item prologue: Q staging (LDG -> STS)"),
           (0xb70d0, 0xb7600, "item prologue: barrier, O zeroing"),
           (0xb7600, 0xc6000, "warpgroup 1 pair loop"),
           (0xc6000, 0xd5000, "warpgroup 0 pair loop"),
           (0xd5000, 0xfffff, "finish (ml_finish)")]
WAITS = {0xb7d10: "TMA wait, own stage part 0", 0xb80e0: "TMA wait, own stage part 1",
         0xb85a0: "S wait", 0xc3180: "SC0 wait (warpgroup 0's reference)",
         0xc5070: "P0 wait", 0xc5570: "remote P V wait",
         0xc6c30: "TMA wait, own stage part 0", 0xc71c0: "TMA wait, own stage part 1",
         0xc78e0: "S wait", 0xd3750: "local P V wait after SC1", 0xd49e0: "P1 wait",
         0xd4c10: "remote P V wait"}


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def main():
    rows = list(csv.reader(gzip.open(sys.argv[1], "rt", errors="replace")))
    hi = next(i for i, r in enumerate(rows) if "Address" in r and "Source" in r)
    h, d = rows[hi], [r for r in rows[hi + 1:] if len(r) > 3]
    A, S = h.index("Address"), h.index("Source")
    W = h.index("Warp Stall Sampling (All Samples)")
    tot = sum(num(r[W]) for r in d) or 1.0
    g = collections.defaultdict(float)
    for r in d:
        a = int(r[A], 16) & 0xfffff
        reg = next(n for lo, hi_, n in REGIONS if lo <= a < hi_)
        s = r[S].strip()
        k = WAITS.get(a) or ("HGMMA issue" if "HGMMA" in s else
                             "barrier / fence instructions" if ("BAR" in s or "FENCE" in s) else
                             "other instructions")
        g[(reg, k)] += num(r[W])
    for _, _, reg in REGIONS:
        s = sum(v for (rg, _), v in g.items() if rg == reg)
        print("%5.1f%%  %s" % (100 * s / tot, reg))
        if "loop" in reg and "row loop" not in reg:
            for (rg, k), v in sorted(g.items(), key=lambda x: -x[1]):
                if rg == reg and 100 * v / tot >= 0.3:
                    print("         %5.2f%%  %s" % (100 * v / tot, k))


if __name__ == "__main__":
    main()
