"""G-test with a controlled false-positive rate, and the power it has.

Rules (see docs/losslessness.md): alpha = 1e-6 per check, so a suite of up to 1,000 checks has a
family-wise error of at most 1e-3; cells with expected count < 5 are merged; a sample on a
zero-probability cell fails at once, with no p-value. Every check also reports the total
variation it detects with 99% power at its sample size: the least favourable alternative at TV
eps has chi-square divergence 4 eps^2 (Cauchy-Schwarz), so the G statistic is approximately
noncentral chi-square with noncentrality 4 n eps^2.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import optimize, stats

ALPHA = 1e-6
POWER = 0.99
MIN_EXPECTED = 5.0


@dataclass(frozen=True)
class GTest:
    statistic: float
    df: int
    p_value: float
    n: int
    zero_hits: int  # samples on cells the target gives probability 0
    detectable_tv: float  # TV detected with 99% power at this n and df
    observed_tv: float  # TV between the empirical and the expected law
    alpha: float = ALPHA

    @property
    def passed(self) -> bool:
        return self.zero_hits == 0 and self.p_value > self.alpha


def merge_cells(counts: np.ndarray, expected: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group cells so that every group expects >= MIN_EXPECTED samples.

    Cells are walked in ascending expected count and accumulated into a group until it reaches
    the bar; a last group under the bar joins the previous one. The grouping depends on the
    expected counts only, so the test stays valid. Zero-expectation cells must be removed first.
    """
    order = np.argsort(expected, kind="stable")
    e, c = expected[order], counts[order]
    group = np.zeros(e.shape[0], dtype=np.int64)
    g, acc = 0, 0.0
    for i, ei in enumerate(e):
        group[i] = g
        acc += ei
        if acc >= MIN_EXPECTED:
            g, acc = g + 1, 0.0
    n_groups = g + (1 if acc > 0 else 0)
    if acc > 0 and g > 0:  # the tail group is under the bar: fold it into the previous one
        group[group == g] = g - 1
        n_groups = g
    return (
        np.bincount(group, weights=c, minlength=n_groups),
        np.bincount(group, weights=e, minlength=n_groups),
    )


@lru_cache(maxsize=1024)
def detectable_tv(n: int, df: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """Smallest TV the G-test rejects with probability >= ``power`` (worst direction)."""
    if df < 1 or n < 1:
        return float("nan")
    crit = stats.chi2.isf(alpha, df)

    def gap(eps: float) -> float:
        return stats.ncx2.sf(crit, df, 4.0 * n * eps * eps) - power

    if gap(1.0) < 0:
        return 1.0
    return float(optimize.brentq(gap, 1e-9, 1.0, xtol=1e-7))


def g_test(counts: np.ndarray, probs: np.ndarray, alpha: float = ALPHA) -> GTest:
    """G-test of observed ``counts`` against the law ``probs`` (same cell order).

    2-D inputs are strata (rows): each row of ``probs`` is the law of its row of counts, the
    test is conditional on the row totals (a stratum's share is not part of the null), and the
    statistic and degrees of freedom add up over strata. Cells are merged within a stratum.
    """
    counts = np.atleast_2d(np.asarray(counts, dtype=np.float64))
    probs = np.atleast_2d(np.asarray(probs, dtype=np.float64))
    per = counts.sum(axis=1)
    n = int(per.sum())
    zero = probs <= 0
    zero_hits = int(counts[zero].sum())
    expected = per[:, None] * probs
    observed_tv = 0.5 * float(np.abs(counts - expected).sum()) / max(n, 1)
    if zero_hits:  # fails at once: the target can never produce these outputs
        return GTest(float("inf"), 0, 0.0, n, zero_hits, float("nan"), observed_tv, alpha)
    stat, df = 0.0, 0
    for s in np.flatnonzero(per > 0):
        c, e = merge_cells(counts[s][~zero[s]], expected[s][~zero[s]])
        df += int(c.shape[0]) - 1
        hit = c > 0
        stat += 2.0 * float(np.sum(c[hit] * np.log(c[hit] / e[hit])))
    if df < 1:  # point masses: only zero-probability hits can fail them
        return GTest(0.0, 0, 1.0, n, 0, float("nan"), observed_tv, alpha)
    p_value = float(stats.chi2.sf(stat, df))
    return GTest(stat, df, p_value, n, zero_hits, detectable_tv(n, df, alpha), observed_tv, alpha)


# --- the sequential test --------------------------------------------------------------------

ALPHA_RUN = 1e-6  # family-wise false-alarm rate of one check-lossless run (all worlds, looks)
LOOK_FRACTIONS = (1 / 64, 1 / 16, 1 / 4, 1.0)  # looks at these fractions of the planned n
EXTEND = 2  # a borderline final look (p < BORDERLINE) buys one more look at EXTEND x n
BORDERLINE = 1e-3
LOOKS = len(LOOK_FRACTIONS) + 1  # the extension look is budgeted whether it runs or not
TARGET_TV = 1e-3  # the planned n detects this TV with 99% power where the cap allows


@dataclass(frozen=True)
class Sequential:
    """Outcome of a group-sequential G-test: the last look's test, the looks taken and the floor.

    ``floor_tv``: the TV detected with 99% power at the planned n and the per-look alpha (the
    least favourable direction): what "consistent" means for this world.
    """

    last: GTest
    looks: int
    n: int
    alpha_look: float
    floor_tv: float

    @property
    def passed(self) -> bool:
        return self.last.zero_hits == 0 and self.last.p_value > self.alpha_look


def alpha_per_look(n_checks: int) -> float:
    """Bonferroni over the run's statistical checks and every look of each: the family-wise
    false-alarm rate of the run stays <= ALPHA_RUN (looks on cumulative counts are dependent,
    so the bound is conservative)."""
    return ALPHA_RUN / max(1, n_checks) / LOOKS


def planned_n(df: int, alpha: float, tv: float = TARGET_TV, power: float = POWER) -> int:
    """Samples the G-test needs to detect ``tv`` with ``power`` at ``alpha`` (worst direction)."""
    if df < 1:
        return 0
    crit = stats.chi2.isf(alpha, df)
    lam = optimize.brentq(lambda nc: stats.ncx2.sf(crit, df, nc) - power, 1e-6, 1e7)
    return int(np.ceil(lam / (4.0 * tv * tv)))


def effective_df(probs: np.ndarray, n: int) -> int:
    """Degrees of freedom the G-test will have at n samples (after merging cells).

    With strata (2-D), how the n samples split between them is not known in advance: the bound
    assumes every stratum gets all n (more cells survive merging: more degrees of freedom, a
    larger planned n, never less power than stated)."""
    df = 0
    for row in np.atleast_2d(np.asarray(probs, dtype=np.float64)):
        p = row[row > 0]
        if p.size:
            _, e = merge_cells(np.zeros_like(p), n * p)
            df += int(e.shape[0]) - 1
    return max(df, 0)


def sequential_test(counts_at, probs: np.ndarray, n_max: int, alpha_look: float) -> Sequential:
    """Look at the cumulative counts ``counts_at(n)`` at n_max/64, /16, /4 and n_max; stop at the
    first look that rejects (overwhelming evidence, or any sample on a zero-probability
    output); when the last look is borderline (p < 1e-3) look once more at 2 n_max."""
    plan = [max(1, int(n_max * f)) for f in LOOK_FRACTIONS]
    g = None
    looks = 0
    for n in plan:
        g = g_test(counts_at(n), probs, alpha_look)
        looks += 1
        if g.zero_hits or g.p_value <= alpha_look:
            break
    assert g is not None
    if looks == len(plan) and not (g.zero_hits or g.p_value <= alpha_look):
        if g.p_value < BORDERLINE:
            g = g_test(counts_at(EXTEND * n_max), probs, alpha_look)
            looks += 1
    df = g.df if g.df >= 1 else effective_df(probs, n_max)
    floor = detectable_tv(n_max, df, alpha_look) if df >= 1 else float("nan")
    return Sequential(g, looks, g.n, alpha_look, floor)
