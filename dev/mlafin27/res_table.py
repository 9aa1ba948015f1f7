#!/usr/bin/env python3
"""res_table.py BASE.txt NEW.txt: the lines of scripts/sass_stats.py (each prefixed with
'OBJECT: ') for base and new side by side, one kernel a line: registers, stack, static shared
memory, spills, SASS instructions, memory instructions, mma, and whether the SASS hash is the
same."""
import re, sys


def load(p):
    d = {}
    for line in open(p):
        obj, rest = line.split(': ', 1)
        m = re.match(r'(.*?)\s+ins\s+(\d+) reg\s+(\d+) stack\s+(\d+) smem\s+(\d+) mem\s+(\d+) '
                     r'spill\s+(\d+) mma\s+(\d+) sfu\s+(\d+) sync\s+(\d+) (\w+)', rest)
        if m:
            d[(obj, m[1].strip())] = m.groups()[1:]
    return d


def pair(x, y):
    return x if x == y else f'{x}->{y}'


a, b = load(sys.argv[1]), load(sys.argv[2])
print(f"{'object: kernel':80} {'reg':>9} {'stack':>5} {'smem':>5} {'spill':>5} {'SASS ins':>11} "
      f"{'mem ins':>9} {'mma':>4} {'hash':>4}")
for k, x in a.items():
    y = b.get(k)
    if y is None:
        print(f'{(k[0] + ": " + k[1])[:80]:80} only in base')
        continue
    print(f"{(k[0] + ': ' + k[1])[:80]:80} {pair(x[1], y[1]):>9} {pair(x[2], y[2]):>5} "
          f"{pair(x[3], y[3]):>5} {pair(x[5], y[5]):>5} {pair(x[0], y[0]):>11} {pair(x[4], y[4]):>9} "
          f"{pair(x[6], y[6]):>4} {'same' if x[9] == y[9] else 'diff':>4}")
