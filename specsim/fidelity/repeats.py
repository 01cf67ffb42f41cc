"""Repeat-until-tight: how many times a real cell is measured, and the interval of its median.

Why: with a fixed 2 repeats the real engine's own repeat-to-repeat spread (median 12%, worst
52% on llama-server, reports/llama-cpp) was larger than the simulator's error, so the grid
could not tell model error from noise. Here every cell is repeated until the 95% interval of
its median is within ``tol`` (e.g. +-3%) of the median, on every compared metric, or until
``max_repeats``; a cell still wider then is listed (``Schedule.wide``), never dropped.

The interval (:func:`median_interval`):

- ``n >= n_os(level)`` (6 at 95%): the distribution-free order-statistic interval
  ``[x_(k), x_(n-k+1)]`` with the largest ``k`` whose binomial coverage
  ``1 - 2 P(Bin(n, 1/2) <= k - 1)`` is at least ``level``. No assumption on the noise, and one
  hiccup run (a descheduled server) moves it by one order statistic only. Its coverage is
  conservative (96.9% at n = 6, 96.1% at n = 12: discrete).
- ``2 <= n < n_os``: no order-statistic interval reaches 95% (at n = 5 the widest,
  ``[min, max]``, covers 93.75%), so an assumption is needed: a Student-t interval on the mean
  of the log values, exponentiated. Why logs: timing noise is multiplicative and
  right-skewed (a run is slowed by a fraction, never by a negative time), so log values are
  close to symmetric, and for a log-symmetric distribution the mean of the logs estimates the
  log of the median. Exact under lognormal noise; a bootstrap instead would under-cover
  badly at n = 3 (it cannot be wider than the sample's range, which covers the median only
  75% of the time at n = 3). At n = 5 its half-width (1.24 sigma) is close to the n = 6
  order-statistic one's (about 1.27 sigma), so the switch does not jump.
- ``n < 2``: no interval (NaN bounds), never converged.

The point estimate is always the sample median. The stopping rule (:func:`needs_more`) looks
at the interval after every round; stopping on a narrow interval selects samples whose spread
came out small, so the coverage at the stopping time is a little below the fixed-n coverage
(measured in tests/test_fidelity_repeats.py and docs/fidelity.md).

The schedule (:func:`interleaved_schedule`) runs the cells round-robin: every open cell once
per round, in the grid's order, so slow drift of the machine's speed hits all cells alike
instead of the cells that happen to run last; warm-up rounds come first and are discarded.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from specsim.errors import SpecsimError

# the metrics a cell must be tight on, by default (the goals are on these two)
DEFAULT_METRICS = ("throughput_tok_s", "tpot_ms_mean")


@dataclass(frozen=True)
class Interval:
    """The sample median of ``n`` finite values and its interval at ``level``; ``method`` is
    ``order`` (order statistics), ``t-log`` (t on the log values) or ``none`` (n < 2)."""

    median: float
    lo: float
    hi: float
    n: int
    level: float
    method: str

    def half_width(self) -> float:
        """The interval's larger side relative to the median (inf without an interval)."""
        if not (self.n >= 2 and math.isfinite(self.lo) and math.isfinite(self.hi)):
            return math.inf
        if self.median <= 0:
            return math.inf
        return max(self.hi / self.median - 1.0, 1.0 - self.lo / self.median)

    def within(self, tol: float) -> bool:
        """True when both ends are within ``tol`` of the median (lo >= m(1-tol), hi <= m(1+tol))."""
        return self.half_width() <= tol


def n_os(level: float = 0.95) -> int:
    """The smallest n with an order-statistic interval of the median at ``level``: [min, max]
    covers ``1 - 2^(1-n)``, so n >= 1 + log2(1 / (1 - level)) (6 at 95%)."""
    _check_level(level)
    return max(2, math.ceil(1.0 + math.log2(1.0 / (1.0 - level)) - 1e-12))


def _check_level(level: float) -> None:
    if not (0.0 < level < 1.0):
        raise SpecsimError(f"the interval's level must be in (0, 1), e.g. 0.95; got {level}")


@lru_cache(maxsize=4096)
def order_rank(n: int, level: float = 0.95) -> int:
    """The largest k (1-based) with P(x_(k) <= median <= x_(n-k+1)) >= level; 0 if none."""
    from scipy.stats import binom

    k = 0
    for cand in range(1, n // 2 + 1):
        if 1.0 - 2.0 * float(binom.cdf(cand - 1, n, 0.5)) >= level:
            k = cand
        else:
            break
    return k


def median_interval(values: Sequence[float], level: float = 0.95) -> Interval:
    """The sample median of the finite ``values`` and its ``level`` interval (module docstring:
    order statistics from n = :func:`n_os`, a t-interval on the log values below)."""
    _check_level(level)
    x = sorted(float(v) for v in values if v is not None and math.isfinite(float(v)))
    n = len(x)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, level, "none")
    mid = n // 2
    med = x[mid] if n % 2 else 0.5 * (x[mid - 1] + x[mid])
    if n < 2:
        return Interval(med, math.nan, math.nan, n, level, "none")
    k = order_rank(n, level)
    if k >= 1:
        return Interval(med, x[k - 1], x[n - k], n, level, "order")
    if x[0] <= 0:  # logs need positive values (throughput and TPOT are)
        return Interval(med, math.nan, math.nan, n, level, "none")
    logs = [math.log(v) for v in x]
    mean = math.fsum(logs) / n
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in logs) / (n - 1))
    half = _t_quantile(0.5 + level / 2.0, n - 1) * sd / math.sqrt(n)
    return Interval(med, math.exp(mean - half), math.exp(mean + half), n, level, "t-log")


@lru_cache(maxsize=4096)
def _t_quantile(q: float, df: int) -> float:
    from scipy.stats import t as student_t

    return float(student_t.ppf(q, df))


def check_rule(tol: float, min_repeats: int, max_repeats: int, warmup: int = 0) -> None:
    """Refuse a stopping rule that cannot work, in one line (the flags' names)."""
    if not (math.isfinite(tol) and 0.0 < tol < 1.0):
        raise SpecsimError(
            f"--target-ci is the interval's half-width as a fraction of the median, in (0, 1), "
            f"e.g. 0.03; got {tol}"
        )
    if min_repeats < 2:
        raise SpecsimError(f"--min-repeats must be at least 2 (an interval), got {min_repeats}")
    if max_repeats < min_repeats:
        raise SpecsimError(
            f"--max-repeats ({max_repeats}) must be at least --min-repeats ({min_repeats})"
        )
    if warmup < 0:
        raise SpecsimError(f"--warmup must be 0 or more runs, got {warmup}")


def needs_more(
    values: Sequence[float] | Mapping[str, Sequence[float]],
    tol: float,
    min_repeats: int,
    max_repeats: int,
    level: float = 0.95,
) -> bool:
    """Whether a cell needs another repeat: fewer than ``min_repeats`` finite values, or (below
    ``max_repeats``) the interval of some metric's median wider than ``tol`` of it. ``values``
    is one metric's values or a mapping metric -> values (every metric must be tight)."""
    check_rule(tol, min_repeats, max_repeats)
    per = values if isinstance(values, Mapping) else {"value": values}
    for vals in per.values():
        n = sum(1 for v in vals if v is not None and math.isfinite(float(v)))
        if n >= max_repeats:
            continue
        if n < min_repeats or not median_interval(vals, level).within(tol):
            return True
    return False


@dataclass(frozen=True)
class Run:
    """One run of the schedule, in the order it ran: its cell, the cell's run index (warm-ups
    included), the round, whether it was a discarded warm-up, and what ``run_one`` returned."""

    cell: Hashable
    index: int
    round: int
    warmup: bool
    result: Mapping[str, Any]


@dataclass
class Schedule:
    """What :func:`interleaved_schedule` ran: every run in order, and per cell and metric the
    interval over the kept (non-warm-up) runs, whether the cell converged, and the cells that
    did not (wide after ``max_repeats``: reported, never dropped)."""

    runs: list[Run] = field(default_factory=list)
    intervals: dict[Hashable, dict[str, Interval]] = field(default_factory=dict)
    converged: dict[Hashable, bool] = field(default_factory=dict)

    @property
    def wide(self) -> list[Hashable]:
        return [c for c, ok in self.converged.items() if not ok]

    def kept(self, cell: Hashable) -> list[Mapping[str, Any]]:
        return [r.result for r in self.runs if r.cell == cell and not r.warmup]


def interleaved_schedule(
    cells: Sequence[Hashable],
    run_one: Callable[[Hashable, int], Mapping[str, Any]],
    *,
    tol: float = 0.03,
    min_repeats: int = 3,
    max_repeats: int = 12,
    warmup: int = 1,
    level: float = 0.95,
    metrics: Sequence[str] = DEFAULT_METRICS,
    log: Callable[[str], None] | None = None,
    after_round: Callable[[int], Any] | None = None,
) -> Schedule:
    """Run ``run_one(cell, index)`` round-robin until every cell is tight or at
    ``max_repeats`` kept runs. Rounds: ``warmup`` rounds of every cell (kept in ``runs``,
    marked, left out of the intervals), then rounds over the cells still open, in the order of
    ``cells`` (a cell that is tight drops out; the rest keep their relative order, so drift
    over the session spreads over every open cell's repeats alike). ``run_one`` returns a
    mapping holding at least ``metrics``; a non-finite value (a failed run) counts as a run
    towards ``max_repeats`` but not towards the interval. ``after_round(r)`` is called after
    round ``r`` (warm-ups included), e.g. to measure the machine between rounds."""
    check_rule(tol, min_repeats, max_repeats, warmup)
    if len(set(cells)) != len(cells):
        raise SpecsimError("interleaved_schedule: the cells must be distinct")
    sched = Schedule()
    done = {c: 0 for c in cells}  # runs so far per cell, warm-ups included
    kept: dict[Hashable, dict[str, list[float]]] = {c: {m: [] for m in metrics} for c in cells}
    rnd = 0
    for _ in range(warmup):
        for c in cells:
            sched.runs.append(Run(c, done[c], rnd, True, run_one(c, done[c])))
            done[c] += 1
        if after_round is not None:
            after_round(rnd)
        rnd += 1
    open_cells = list(cells)
    while open_cells:
        for c in open_cells:
            res = run_one(c, done[c])
            sched.runs.append(Run(c, done[c], rnd, False, res))
            done[c] += 1
            for m in metrics:
                v = res.get(m, math.nan)
                kept[c][m].append(float(v) if v is not None else math.nan)
        if after_round is not None:
            after_round(rnd)
        rnd += 1
        still = []
        for c in open_cells:
            runs = len(kept[c][metrics[0]]) if metrics else done[c] - warmup
            if runs < max_repeats and needs_more(kept[c], tol, min_repeats, max_repeats, level):
                still.append(c)
        if log is not None:
            log(f"  round {rnd}: {len(open_cells) - len(still)} cells closed, {len(still)} open")
        open_cells = still
    for c in cells:
        iv = {m: median_interval(kept[c][m], level) for m in metrics}
        sched.intervals[c] = iv
        sched.converged[c] = all(i.within(tol) for i in iv.values())
    return sched


def interval_columns(iv: Mapping[str, Interval], short: Mapping[str, str]) -> dict[str, Any]:
    """A cell's interval as tidy columns: ``<short>_median``, ``<short>_lo``, ``<short>_hi``,
    ``<short>_ci`` (the half-width as a fraction of the median) per metric."""
    out: dict[str, Any] = {}
    for m, i in iv.items():
        s = short.get(m, m)
        out[f"{s}_median"], out[f"{s}_lo"], out[f"{s}_hi"] = i.median, i.lo, i.hi
        out[f"{s}_ci"] = i.half_width()
    return out


def repeats_for(sigma: float, tol: float = 0.03, level: float = 0.95) -> int:
    """About how many repeats a cell needs before its median's interval is within ``tol``,
    for a run-to-run log spread ``sigma`` (asymptotic: the sample median's standard error is
    sqrt(pi / 2) sigma / sqrt(n) under normal noise). For planning a grid: the llama-server
    tuning runs (reports/llama-cpp) had sigma ~ 0.08 on throughput, i.e. ~43 repeats at 3%;
    within the default 12 repeats takes sigma <= ~0.04."""
    from scipy.stats import norm

    z = float(norm.ppf(0.5 + level / 2.0))
    return max(2, math.ceil((z * math.sqrt(math.pi / 2.0) * sigma / tol) ** 2))
