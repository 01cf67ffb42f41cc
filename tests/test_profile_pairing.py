"""The engine profile's table points are timed paired with an anchor shape: on a machine whose
speed moves +-20% between calls (this VM within seconds), the pair ratios keep the table's true
proportions, where medians of a few lone timings bend them. Synthetic timings, exact costs."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

pytest.importorskip("torch")

from specsim.torch_engine.timing import _anchor_scaled  # noqa: E402

COST = {(64, 1): 66.0, (64, 2): 69.6, (64, 3): 75.0, (256, 1): 71.0, (-1, 32): 140.0}
ANCHOR = (64, 1)


def drifting_timings(repeats: int, seed: int):  # type: ignore[no-untyped-def]
    """Each pair runs at one speed drawn from a +-20%-ish lognormal, shared by both calls (cpu),
    and the wall clock 1.3x slower again; the same schedule as the profile (anchor, then point)."""
    gen = np.random.default_rng(seed)
    anchor_t, ratios, lone = [], {pt: [] for pt in COST}, {pt: [] for pt in COST}
    for _ in range(repeats):
        for k in gen.permutation(len(COST)):
            pt = list(COST)[int(k)]
            speed = float(np.exp(gen.normal(0.0, 0.2)))
            ta = (COST[ANCHOR] * speed, COST[ANCHOR] * speed * 1.3)
            tp = (COST[pt] * speed, COST[pt] * speed * 1.3)
            anchor_t.append(ta)
            ratios[pt].append((tp[0] / ta[0], tp[1] / ta[1]))
            lone[pt].append(tp[0])
    return anchor_t, ratios, lone


def test_pairs_keep_the_true_proportions_under_drift():
    anchor_t, ratios, lone = drifting_timings(repeats=3, seed=0)
    med = _anchor_scaled(ANCHOR, anchor_t, ratios)
    assert set(med) == set(COST)
    for pt, cost in COST.items():
        # cpu and wall both: the speed cancels in each pair, only the anchor's level remains
        assert med[pt][0] / med[ANCHOR][0] == pytest.approx(cost / COST[ANCHOR], rel=1e-12)
        assert med[pt][1] / med[ANCHOR][1] == pytest.approx(cost / COST[ANCHOR], rel=1e-12)
    # the anchor's level is the median of all its timings (many: one per pair)
    assert med[ANCHOR][0] == statistics.median(t[0] for t in anchor_t)
    # teeth: lone medians of 3 on the same timings bend B = 2 against B = 1 by several percent
    lone_med = {pt: statistics.median(v) for pt, v in lone.items()}
    bent = abs(lone_med[(64, 2)] / lone_med[ANCHOR] - COST[(64, 2)] / COST[ANCHOR])
    assert bent > 0.01
