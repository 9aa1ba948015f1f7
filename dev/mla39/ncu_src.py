#!/usr/bin/env python3
"""dev/mla39/ncu_src.py - where the warps of one kernel wait, from Nsight
Compute's source page as CSV (SASS), e.g.

    ncu --clock-control none --section SourceCounters -k regex:mla_wgmma \
        --launch-skip 1 --launch-count 1 -o rep bench_cuda_mla ...
    ncu -i rep.ncu-rep --page source --csv --print-source sass > sass.csv
    python3 dev/mla39/ncu_src.py sass.csv[.gz] [top]

Prints the share of all warp-state samples (stalled or issuing) of:
  - each mbarrier wait, named by its shared-memory operand: the samples of
    the branch that consumes the predicate of an inline
    SYNCS.PHASECHK...TRYWAIT (the warp sleeps inside try_wait and the
    sample lands on that branch, stall_long_sb), with the retry count of
    its out-of-line loop;
  - each WARPGROUP.DEPBAR (wgmma.wait_group; Nsight Compute counts these
    as stall_barrier, like bar.sync);
  - the instructions up to 3 after each named or CTA barrier (BAR.SYNC
    a, n: the sample of a warp held at it lands on a later instruction,
    stall_barrier);
  - HGMMA issue, and everything else by opcode;
then the top instructions. Addresses are the last 5 hex digits.
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
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    op = gzip.open if path.endswith(".gz") else open
    rows = list(csv.reader(op(path, "rt", errors="replace")))
    hi = next(i for i, r in enumerate(rows) if "Address" in r and "Source" in r)
    h, d = rows[hi], [r for r in rows[hi + 1:] if len(r) > 3]
    A, SRC = h.index("Address"), h.index("Source")
    S = h.index("Warp Stall Sampling (All Samples)")
    EX = h.index("Instructions Executed")
    BAR = h.index("stall_barrier")
    reasons = [(i, c) for i, c in enumerate(h) if c.startswith("stall_") and "Not Issued" not in c]
    tot = sum(num(r[S]) for r in d) or 1.0
    a5 = [r[A][-5:] for r in d]
    src = [r[SRC].strip() for r in d]

    def operand(s):  # "[R201+URZ+0x36010]" -> "+0x36010"
        o = s[s.index("[") + 1: s.index("]")]
        return o[o.rfind("+"):] if "+" in o else o

    # Out-of-line retry loops: a TRYWAIT whose next line branches back to the
    # address just before it; the inline wait's branch jumps to that address.
    retry = {}
    for i, s in enumerate(src):
        if "TRYWAIT" in s and i + 1 < len(src) and "BRA" in src[i + 1]:
            tgt = src[i + 1].split()[-1][-5:]
            if i > 0 and a5[i - 1] == tgt:
                retry[tgt] = (operand(s), num(d[i][EX]))
    g = collections.Counter()
    label = {}
    for i, s in enumerate(src):
        v = num(d[i][S])
        if "BRA" in s and s.split()[-1][-5:] in retry and not (i > 0 and "TRYWAIT" in src[i - 1]
                                                               and a5[i - 1] in retry):
            o, n = retry[s.split()[-1][-5:]]
            k = "mbarrier wait %s (retries %d)" % (o, n)
        elif "DEPBAR" in s and "WARPGROUP" in s:
            k = "wgmma wait %s at %s" % (s.split()[-1], a5[i])
        elif any("BAR.SYNC" in src[j] for j in range(max(0, i - 3), i)) and (
                "BAR.SYNC" in src[i - 1] or num(d[i][BAR]) > 0.5 * v):
            j = max(j for j in range(max(0, i - 3), i) if "BAR.SYNC" in src[j])
            k = "after %s at %s" % (src[j].replace("BAR.SYNC.DEFER_BLOCKING", "bar.sync"), a5[j])
        elif "HGMMA" in s:
            k = "HGMMA issue"
        else:
            w = s.split()
            w = w[1] if w and w[0].startswith("@") and len(w) > 1 else (w[0] if w else "?")
            k = "other: " + w.split(".")[0]
        g[k] += v
        label[i] = k
    print("samples: %d" % tot)
    for k, v in sorted(g.items(), key=lambda x: -x[1]):
        if 100 * v / tot >= 0.2:
            print("%6.2f%%  %s" % (100 * v / tot, k))
    print("-- top instructions")
    for i in sorted(range(len(d)), key=lambda i: -num(d[i][S]))[:top]:
        rs = sorted(((num(d[i][j]), c) for j, c in reasons), reverse=True)[:2]
        print("%6.2f%%  %s  %-58s %s" % (100 * num(d[i][S]) / tot, a5[i], src[i][:58],
                                         " ".join("%s=%d" % (c[6:], v) for v, c in rs if v)))


if __name__ == "__main__":
    main()
