"""DDSketch: a mergeable quantile sketch with a relative-error guarantee (Masson, Rim and Lee,
"DDSketch: a fast and fully-mergeable quantile sketch with relative-error guarantees", VLDB 2019).

Why: a day of traffic has too many requests to keep their latencies for ``np.percentile``; a
TTFT p99 of 812 ms reported as 812 +- 4 ms is as useful as the exact one, and the sketch's
memory depends on the range of the values (about 2,100 buckets from 1 us to 1,000 s at the
default alpha), not on how many there are. Two sketches of the same alpha merge into the
sketch of the union exactly (bucket counts add), so sweeps and sharded runs can combine them.

Mapping (the paper's logarithmic one): gamma = (1 + alpha) / (1 - alpha); a value x > 0 goes
to bucket i = ceil(log_gamma(x)), which holds (gamma^(i-1), gamma^i], and a bucket is read as
2 gamma^i / (gamma + 1), within relative error alpha of every value in it. Negative values go
to a mirrored store by |x|, zeros to a count of their own (read as 0, exactly). Values that are
not finite (the NaN TPOT of a one-token output, an infinite rate) are skipped and counted in
``skipped``, as the exact summary drops them before ``np.percentile``.

Rank convention and guarantee. Of n kept values sorted x_(0) <= ... <= x_(n-1), quantile q in
[0, 1] has the position h = q (n - 1) (numpy's default ``linear`` method, the one the exact
summary's ``np.percentile`` uses). ``quantile(q, "lower")`` returns an estimate of x_(floor h),
the paper's element of rank floor(1 + q (n - 1)) (1-based), within relative error alpha:
|est - x_(floor h)| <= alpha |x_(floor h)|, so it is ``np.quantile(x, q, method="lower")``
within alpha. ``quantile(q)`` (``"linear"``, the default) interpolates the estimates of
x_(floor h) and x_(ceil h) with numpy's weight h - floor h, so it is within
alpha ((1 - f) |x_(floor h)| + f |x_(ceil h)|) of ``np.percentile(x, 100 q)``: within alpha of
it, relatively, whenever the two neighbours have the same sign (every latency, TPOT and rate
here is >= 0). Estimates are clamped to the [min, max] seen, which only brings them closer,
and ranks 0 and n - 1 return the min and max themselves (kept exactly).
Floating point: the bucket index comes from a rounded logarithm, so a value within an ulp or
so of a bucket edge may land in the neighbouring bucket; its error is then alpha (1 + ~1e-15).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

DEFAULT_ALPHA = 0.005


@dataclass(frozen=True)
class SketchConfig:
    """The sketch's one knob: the relative error ``alpha`` in (0, 1)."""

    alpha: float = DEFAULT_ALPHA

    def __post_init__(self) -> None:
        if not (isinstance(self.alpha, float | int) and 0.0 < float(self.alpha) < 1.0):
            raise ValueError(f"DDSketch alpha must be in (0, 1), got {self.alpha!r}")


class _Store:
    """Bucket counts over a dense, growing range of indices (``counts[k]`` is bucket
    ``offset + k``): one ``np.bincount`` per batch, whatever its size."""

    __slots__ = ("counts", "offset")

    def __init__(self) -> None:
        self.counts = np.zeros(0, dtype=np.int64)
        self.offset = 0

    def _cover(self, lo: int, hi: int) -> None:
        """Grow to hold buckets lo..hi (inclusive)."""
        if self.counts.size == 0:
            self.counts = np.zeros(hi - lo + 1, dtype=np.int64)
            self.offset = lo
            return
        cur_lo, cur_hi = self.offset, self.offset + self.counts.size - 1
        new_lo, new_hi = min(lo, cur_lo), max(hi, cur_hi)
        if (new_lo, new_hi) == (cur_lo, cur_hi):
            return
        grown = np.zeros(new_hi - new_lo + 1, dtype=np.int64)
        grown[cur_lo - new_lo : cur_lo - new_lo + self.counts.size] = self.counts
        self.counts, self.offset = grown, new_lo

    def add(self, idx: np.ndarray) -> None:
        if idx.size == 0:
            return
        lo, hi = int(idx.min()), int(idx.max())
        self._cover(lo, hi)
        k = lo - self.offset
        self.counts[k : k + hi - lo + 1] += np.bincount(idx - lo, minlength=hi - lo + 1)

    def merge(self, other: _Store) -> None:
        if other.counts.size == 0:
            return
        lo = other.offset
        self._cover(lo, lo + other.counts.size - 1)
        k = lo - self.offset
        self.counts[k : k + other.counts.size] += other.counts

    @property
    def total(self) -> int:
        return int(self.counts.sum())

    def nonzero(self) -> tuple[np.ndarray, np.ndarray]:
        """(bucket indices, counts) of the occupied buckets, ascending."""
        k = np.flatnonzero(self.counts)
        return k + self.offset, self.counts[k]


class DDSketch:
    """A DDSketch of float64 values (see the module docstring for the guarantee).

    ``add(array)`` inserts a whole array with a few numpy calls; ``merge(other)`` adds
    another sketch of the same alpha; ``quantile(q)`` / ``percentile(p)`` read it."""

    def __init__(self, alpha: float = DEFAULT_ALPHA) -> None:
        self.config = SketchConfig(float(alpha))
        self.alpha = float(alpha)
        self.gamma = (1.0 + self.alpha) / (1.0 - self.alpha)
        # log(gamma) as log1p(2 alpha / (1 - alpha)): accurate for small alpha
        self._ln_gamma = math.log1p(2.0 * self.alpha / (1.0 - self.alpha))
        self._pos = _Store()
        self._neg = _Store()
        self.zeros = 0
        self.count = 0  # values kept (finite)
        self.skipped = 0  # values not finite (NaN, +-inf): left out, as np.percentile's caller does
        self.min = math.inf
        self.max = -math.inf

    # ------------------------------------------------------------------ insert

    def _index(self, mag: np.ndarray) -> np.ndarray:
        return np.ceil(np.log(mag) / self._ln_gamma).astype(np.int64)

    def add(self, values: np.ndarray | float) -> None:
        """Insert every value of ``values`` (any shape; non-finite ones are skipped)."""
        x = np.asarray(values, dtype=np.float64).ravel()
        if x.size == 0:
            return
        finite = np.isfinite(x)
        n_fin = int(np.count_nonzero(finite))
        self.skipped += x.size - n_fin
        if n_fin == 0:
            return
        if n_fin < x.size:
            x = x[finite]
        self.count += n_fin
        self.min = min(self.min, float(x.min()))
        self.max = max(self.max, float(x.max()))
        pos = x[x > 0.0]
        neg = x[x < 0.0]
        self.zeros += n_fin - pos.size - neg.size
        self._pos.add(self._index(pos))
        self._neg.add(self._index(-neg))

    def merge(self, other: DDSketch) -> None:
        """Add ``other``'s values (same alpha): the result is the sketch of the union."""
        if other.alpha != self.alpha:
            raise ValueError(f"cannot merge DDSketches of alpha {self.alpha} and {other.alpha}")
        self._pos.merge(other._pos)
        self._neg.merge(other._neg)
        self.zeros += other.zeros
        self.count += other.count
        self.skipped += other.skipped
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    # ------------------------------------------------------------------ read

    def _value(self, idx: np.ndarray) -> np.ndarray:
        """A bucket's representative 2 gamma^i / (gamma + 1), via exp (no overflow of
        gamma^i at the top of the double range before the factor brings it back)."""
        return np.exp(idx * self._ln_gamma + math.log(2.0 / (self.gamma + 1.0)))

    def _layout(self) -> tuple[np.ndarray, np.ndarray]:
        """(value, cumulative count) of every occupied bucket in ascending value order:
        negatives (largest magnitude first), zeros, positives."""
        ni, nc = self._neg.nonzero()
        pi, pc = self._pos.nonzero()
        vals = [-self._value(ni[::-1]), np.zeros(1 if self.zeros else 0), self._value(pi)]
        cnts = [nc[::-1], np.array([self.zeros] if self.zeros else [], np.int64), pc]
        return np.concatenate(vals), np.cumsum(np.concatenate(cnts))

    def quantiles(self, qs: np.ndarray | list[float], method: str = "linear") -> np.ndarray:
        """Estimates at quantiles ``qs`` in [0, 1]; NaN for an empty sketch.

        ``method``: ``"linear"`` (numpy's default interpolation between the order statistics
        at floor and ceil of q (n - 1)) or ``"lower"`` (the one at floor)."""
        q = np.atleast_1d(np.asarray(qs, dtype=np.float64))
        if np.any((q < 0) | (q > 1)) or np.any(np.isnan(q)):
            raise ValueError(f"quantiles must be in [0, 1], got {qs!r}")
        if method not in ("linear", "lower"):
            raise ValueError(f"method must be 'linear' or 'lower', got {method!r}")
        if self.count == 0:
            return np.full(q.shape, np.nan)
        vals, cum = self._layout()
        h = q * (self.count - 1)
        lo = np.floor(h)

        def at(rank: np.ndarray) -> np.ndarray:  # the bucket holding 0-based rank `rank`
            v = np.clip(vals[np.searchsorted(cum, rank, side="right")], self.min, self.max)
            v = np.where(rank == 0, self.min, v)  # the extremes are known exactly
            return np.where(rank == self.count - 1, self.max, v)

        est = at(lo)
        if method == "linear":
            frac = h - lo
            hi = np.minimum(lo + 1, self.count - 1)
            est = np.where(frac > 0, est + (at(hi) - est) * frac, est)
        return est

    def quantile(self, q: float, method: str = "linear") -> float:
        return float(self.quantiles([q], method)[0])

    def percentile(self, p: float, method: str = "linear") -> float:
        """``quantile(p / 100)``: the percentile's scale of ``np.percentile``."""
        return self.quantile(p / 100.0, method)

    def __len__(self) -> int:
        return self.count

    def buckets(self) -> int:
        """Occupied buckets (the sketch's memory is the span of its stores, about this)."""
        return int(np.count_nonzero(self._pos.counts) + np.count_nonzero(self._neg.counts))

    def state(self) -> tuple:
        """Everything the sketch holds, comparable with ``==`` (tests: merge = one sketch)."""
        pi, pc = self._pos.nonzero()
        ni, nc = self._neg.nonzero()
        return (
            self.alpha, self.count, self.skipped, self.zeros, self.min, self.max,
            tuple(pi.tolist()), tuple(pc.tolist()), tuple(ni.tolist()), tuple(nc.tolist()),
        )  # fmt: skip
