#!/usr/bin/env python3
"""dev/sp51/ring_sim.py: a host model of the producer-warp ring of mla_decode_mma_kernel
(C::PROD): NST stages, each with a "full" and a "free" mbarrier (try_wait.parity semantics:
waiting on parity P passes once the phase of parity P has completed, so a fresh barrier passes
P = 1), the producer's free parities starting at all ones, the consumer's full parities at zero,
and both sides restarting the stage at 0 with every item, as in the kernel. Random items (0 to 5
tiles), random interleavings and copy landing delays; checks that the consumer reads each tile's
own data, that the producer never refills a stage the consumer has not released, and that
nothing deadlocks. A planted fault (--fault: the producer's free parities start at zero, or
--fault2: the consumer's release skipped on the last tile of an item) must fail."""
import random, sys


class Bar:
    def __init__(self, count):
        self.count, self.pending, self.phase = count, count, 0

    def arrive(self):
        self.pending -= 1
        if self.pending == 0:
            self.phase += 1
            self.pending = self.count

    def passes(self, parity):
        return (self.phase & 1) != parity


def run(seed, nst, fault):
    rng = random.Random(seed)
    items = [rng.randint(0, 5) for _ in range(rng.randint(1, 8))]
    full = [Bar(1) for _ in range(nst)]
    free = [Bar(1) for _ in range(nst)]
    data = [None] * nst       # what the stage holds (item, tile), once landed
    released = [True] * nst   # the consumer is done with the stage's current data
    inflight = []             # (stage, (item, tile), delay)

    def producer():
        fph = 0 if fault == 1 else (1 << nst) - 1
        for it, nt in enumerate(items):
            for t in range(nt):
                st = t % nst
                while not free[st].passes((fph >> st) & 1):
                    yield False
                fph ^= 1 << st
                if not released[st]:
                    raise AssertionError('producer refilled stage %d before its release' % st)
                released[st] = False
                inflight.append((st, (it, t), rng.randint(0, 3)))
                yield True

    def consumer():
        ph = 0
        for it, nt in enumerate(items):
            for t in range(nt):
                st = t % nst
                while not full[st].passes((ph >> st) & 1):
                    yield False
                ph ^= 1 << st
                if data[st] != (it, t):
                    raise AssertionError('consumer read %s in stage %d, wanted %s' % (data[st], st, (it, t)))
                yield True  # computing on the stage
                if fault == 2 and t == nt - 1:
                    continue
                released[st] = True
                free[st].arrive()

    procs = [producer(), consumer()]
    live = [True, True]
    idle = 0
    while any(live):
        progressed = False
        for k in list(inflight):  # copies land after their delay
            st, tag, d = k
            inflight.remove(k)
            if d == 0:
                data[st] = tag
                full[st].arrive()
                progressed = True
            else:
                inflight.append((st, tag, d - 1))
        i = rng.randrange(2)
        if live[i]:
            try:
                progressed |= next(procs[i])
            except StopIteration:
                live[i] = False
        idle = 0 if progressed else idle + 1
        if idle > 1000:
            raise AssertionError('deadlock')
    return sum(items)


def main():
    fault = 1 if '--fault' in sys.argv else 2 if '--fault2' in sys.argv else 0
    bad, tiles = 0, 0
    for seed in range(20000):
        try:
            tiles += run(seed, 3, fault)
        except AssertionError as e:
            bad += 1
            if bad == 1:
                print('seed %d: %s' % (seed, e))
    print('fault %d: %d of 20000 random runs failed (%d tiles)' % (fault, bad, tiles))
    return 1 if (bad > 0) != (fault > 0) else 0


if __name__ == '__main__':
    sys.exit(main())
