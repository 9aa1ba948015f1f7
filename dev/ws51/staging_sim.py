"""VM check of kva__cuda_upload_plan's packed staging (ws51): a Python mirror of its two range
computations over random section layouts, lengths, paddings and prefill-tile trims: every copy
range must lie in one staged range, and the staged bytes must not exceed the old mirrored
image's. Prints the worst ratio of staged to mirrored bytes and the counts. No GPU needed; it
checks the arithmetic, not the C (the H200 tests do that)."""
import random

SPAN, GAP, N = 128 << 10, 32 << 10, 11
ORDER = [0, 3, 4, 5, 7, 9, 6, 1, 2, 8, 10]
a256 = lambda x: (x + 255) & ~255


def staged(off, ln, pad):
    rs = []
    for i in ORDER:
        if ln[i] == 0:
            continue
        if rs and off[i] <= rs[-1][1] + SPAN:
            rs[-1][1] = max(rs[-1][1], off[i] + ln[i])
            continue
        rs.append([off[i], max(off[i] + ln[i], pad) if not rs else off[i] + ln[i]])
    return rs


def copies(off, ln, pad):
    used = [i for i in ORDER if ln[i]]
    first, last = off[used[0]], off[used[-1]] + ln[used[-1]]
    gap = SPAN if last - first <= SPAN else GAP
    out, lo, hi, op = [], 0, 0, False
    for i in ORDER:
        if ln[i] == 0:
            continue
        if op and off[i] - hi > gap:
            out.append((lo, hi)); op = False
        if not op:
            lo, op = off[i], True
        hi = off[i] + ln[i]
    if op and lo == 0 and hi < pad:
        hi = pad
    if op:
        out.append((lo, hi))
    return out


rng = random.Random(51)
worst, n = 0.0, 0
for t in range(200000):
    cap = [256] + [rng.choice([0, rng.randint(1, 4096), rng.randint(1, 1 << 20), rng.randint(1, 64 << 20)])
                   for _ in range(N - 1)]
    off, o = [0] * N, 0
    for i in ORDER:
        off[i] = o
        o = a256(o + cap[i])
    meta = o
    ln = [cap[0]] + [rng.choice([0, c, rng.randint(0, c)]) if c else 0 for c in cap[1:]]
    pad = min(rng.choice([0, 32 << 10, 256 << 10, rng.randint(0, 4 << 20)]), meta)
    st = staged(off, ln, pad)
    ln2 = list(ln)
    ln2[8] = rng.randint(0, ln[8]) // 16 * 16 if ln[8] else 0  # the tiles built
    for lo, hi in copies(off, ln2, pad):
        assert any(a <= lo and hi <= b for a, b in st), (lo, hi, st)
    need = sum(a256(b - a) for a, b in st)
    mirror = max(max(off[i] + ln[i] for i in range(N) if ln[i]), pad)
    assert need <= a256(mirror) + 256 * len(st), (need, mirror)
    worst = max(worst, need / mirror)
    n += 1
print("%d layouts: every copy inside one staged range; staged / mirrored bytes at most %.3f" % (n, worst))
