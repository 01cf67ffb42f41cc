"""Time-weighted runs of consecutive busy slots in a llama-server log, by how many slots are
busy: the real server's layout against a random free slot's expectation."""

import re
import sys
from collections import defaultdict
from itertools import combinations

import numpy as np

TS = re.compile(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) ")


def t_of(line):
    m = TS.match(line)
    a, b, c, d = map(int, m.groups())
    return a * 60 + b + c / 1e3 + d / 1e6


def runs(busy):
    s = sorted(busy)
    return sum(1 for i, x in enumerate(s) if i == 0 or x != s[i - 1] + 1)


def random_runs(k, n=8):
    combos = list(combinations(range(n), k))
    return np.mean([runs(c) for c in combos])


ev = []
for line in open(sys.argv[1], errors="replace"):
    if "launch_slot_" in line or " release: id" in line:
        slot = int(re.search(r"id\s+(\d+)", line).group(1))
        ev.append((t_of(line), +1 if "launch" in line else -1, slot))
ev.sort()
busy, last = set(), None
acc = defaultdict(float)
tot = defaultdict(float)
for t, d, s in ev:
    if last is not None and busy:
        k = len(busy)
        acc[k] += runs(busy) * (t - last)
        tot[k] += t - last
    (busy.add if d > 0 else busy.discard)(s)
    last = t
for k in sorted(tot):
    if tot[k] > 0.5:
        name = sys.argv[1].split("/")[-1]
        mean = acc[k] / tot[k]
        print(f"{name:28} busy {k}: {tot[k]:7.1f} s, runs {mean:.2f} (random {random_runs(k):.2f})")
