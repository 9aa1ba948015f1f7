#!/usr/bin/env python3
"""protocol_sim.py - a model of MW_SCHED_ALT_PROD's hand-offs (mla_wgmma_body.cuh),
checked on the VM before any device call: three agents (consumer warpgroups 0 and 1,
the producer warpgroup; 128 threads each collapsed into one) run the body's
per-item code as a sequence of blocking steps, interleaved at random, over random
item lists (key counts 0 .. 600, skipped items). It reports a deadlock (no agent
can move), a named barrier that one agent passes twice in one generation, and
every ring read whose stage part was rewritten between the read's issue and its
wgmma wait, or held another tile than the read expects. Mirrors the code by hand:
rerun it after changing the loop. Usage: protocol_sim.py [runs] [seed]"""
import random, sys

class Stop(Exception):
    pass

class Sim:
    def __init__(s, items, rng):
        s.items, s.rng = items, rng
        s.full = [[[0, 0] for p in range(2)] for st in range(2)]   # [completed phases, pending]
        s.empty = [[[0, 0] for p in range(2)] for st in range(2)]
        s.part = [[[None, 0] for p in range(2)] for st in range(2)]  # [tile, version]
        s.nb = {}      # named barrier id -> set of arrived agents (count 2: the consumers)
        s.nb_gen = {}
        s.b0 = [set(), 0]
        s.err = []

    # --- primitives as generators: yield a predicate that must hold to go on ---
    def mwait(s, b, parity):
        yield lambda: (b[0] & 1) != parity
    def marrive(s, b):
        b[1] += 1
        if b[1] == 1:          # count 128 = one agent
            b[0] += 1; b[1] = 0
    def nb_arrive(s, who, i):
        arr = s.nb.setdefault(i, set())
        if who in arr:
            s.err.append(f"agent {who} arrived twice at named barrier {i}")
            raise Stop
        arr.add(who)
        if len(arr) == 2:
            s.nb[i] = set(); s.nb_gen[i] = s.nb_gen.get(i, 0) + 1
    def nb_sync(s, who, i):
        g = s.nb_gen.get(i, 0)
        s.nb_arrive(who, i)
        yield lambda: s.nb_gen.get(i, 0) > g
    def bar0(s, who):
        g = s.b0[1]
        s.b0[0].add(who)
        if len(s.b0[0]) == 3:
            s.b0 = [set(), g + 1]
        yield lambda: s.b0[1] > g

    def read_issue(s, st, p, tile):
        return (st, p, tile, s.part[st][p][1])
    def read_done(s, r, what):
        st, p, tile, ver = r
        t, v = s.part[st][p]
        if v != ver:
            s.err.append(f"{what}: stage {st} part {p} rewritten during the read")
        if tile is not None and t != tile:
            s.err.append(f"{what}: stage {st} part {p} holds tile {t}, expected {tile}")

    # --- the consumer warpgroup g (mw_alt_loop, PROD branches) ---
    def consumer(s, g):
        ph = 0
        for (skip, k0, kend) in s.items:
            if skip:
                continue
            yield from s.bar0(g)                       # after stage_q
            kt0 = k0 + 64 * g
            if kt0 < kend:
                yield from s.mwait(s.full[g][0], ph & 1)
            s0 = s.read_issue(g, 0, kt0 if kt0 < kend else None)
            for kb in range(k0, kend, 128):
                kt = kb + 64 * g; have = kt < kend; have1 = kb + 64 < kend; kn = kt + 128
                if have:
                    yield from s.mwait(s.full[g][1], ph & 1)
                s1 = s.read_issue(g, 1, kt if have else None)
                s.read_done(s0, f"wg{g} S part 0 kt {kt}"); s.read_done(s1, f"wg{g} S part 1 kt {kt}")
                if g == 1:
                    yield from s.nb_sync(g, 1)            # SC0
                s.nb_arrive(g, 1 if g == 0 else 2)        # SC0 / SC1
                loc = s.read_issue(g, 0, kt) if have else None
                if g == 0:
                    yield from s.nb_sync(g, 2)            # SC1
                    s.read_done(loc, f"wg0 local PV kt {kt}")
                    s.marrive(s.empty[0][0])
                    pw = s.read_issue(0, 1, kt)           # P into block 8 (part 1)
                    s.read_done(pw, "wg0 P write")
                    s.nb_arrive(g, 3)                     # P0
                    yield from s.nb_sync(g, 4)            # P1
                    rem = s.read_issue(1, 1, kb + 64) if have1 else None
                else:
                    pw = s.read_issue(1, 1, kt) if have else None
                    if pw: s.read_done(pw, "wg1 P write")
                    s.nb_arrive(g, 4)                     # P1
                    yield from s.nb_sync(g, 3)            # P0
                    rem = s.read_issue(0, 1, kb)
                    if loc: s.read_done(loc, f"wg1 local PV kt {kt}")
                    if have:
                        s.marrive(s.empty[1][0])
                if have:
                    ph ^= 1
                if kn < kend:
                    yield from s.mwait(s.full[g][0], ph & 1)
                s0 = s.read_issue(g, 0, kn if kn < kend else None)
                if rem: s.read_done(rem, f"wg{g} remote PV kb {kb}")
                if g == 1 or have1:
                    s.marrive(s.empty[1 - g][1])
                yield lambda: True                        # let others run
            # the unused S part 0 is waited for before the finish; the producer is at its
            # item's end then, so nothing rewrites the part (not checked: its tile is None)
            yield from s.bar0(g)                       # ml_finish: sums
            yield from s.bar0(g)                       # ml_finish: end

    # --- the producer warpgroup (mw_produce, mw_pfill) ---
    def pfill(s, st, p, kt, ph):
        yield from s.mwait(s.empty[st][p], ((ph >> st) & 1) ^ 1)
        s.part[st][p][0] = kt; s.part[st][p][1] += 1
        s.marrive(s.full[st][p])
    def producer(s):
        ph = 0
        for (skip, k0, kend) in s.items:
            if skip:
                continue
            for kb in range(k0, kend, 128):
                have1 = kb + 64 < kend
                yield from s.pfill(0, 0, kb, ph)
                if have1: yield from s.pfill(1, 0, kb + 64, ph)
                if kb == k0:
                    yield from s.bar0(2)
                yield from s.pfill(0, 1, kb, ph)
                if have1: yield from s.pfill(1, 1, kb + 64, ph)
                ph ^= 3 if have1 else 1
            if k0 >= kend:
                yield from s.bar0(2)
            yield from s.bar0(2)
            yield from s.bar0(2)

    def run(s):
        ag = [s.consumer(0), s.consumer(1), s.producer()]
        cond = [None, None, None]
        done = [False] * 3
        try:
            while not all(done):
                ready = [i for i in range(3) if not done[i] and (cond[i] is None or cond[i]())]
                if not ready:
                    s.err.append("DEADLOCK: " + str([(i, done[i]) for i in range(3)]))
                    break
                i = s.rng.choice(ready)
                try:
                    cond[i] = next(ag[i])
                except StopIteration:
                    done[i] = True
        except Stop:
            pass
        return s.err

def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    bad = 0
    for r in range(runs):
        items = []
        for _ in range(rng.randint(1, 5)):
            k0 = rng.choice([0, 0, 64, 128, 512])
            n = rng.choice([0, 1, 63, 64, 65, 127, 128, 129, 192, 200, 256, 600])
            items.append((rng.random() < 0.15, k0, k0 + n if rng.random() < 0.9 else k0 - 5))
        err = Sim(items, rng).run()
        if err:
            bad += 1
            if bad <= 3:
                print("items", items, "->", err[:3])
    print(f"{runs} random runs, {bad} with errors")
    return 1 if bad else 0

if __name__ == "__main__":
    sys.exit(main())
