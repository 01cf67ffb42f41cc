"""Step-time lookups the engine's hot loop calls every step, kept fast: a 2-D profile's step time
as plain Python floats (``Step2D``), the per-trace-row table of survivals, confidences and
acceptance (``row_table``), and the shifted step-time function a policy sees when prefill
tokens share the step. Each is the cost model's arithmetic, restated only where it is checked
against it."""

from __future__ import annotations

import weakref
import zlib
from bisect import bisect_left

import numpy as np

from specsim.errors import SpecsimError
from specsim.policies.base import TableStepTime
from specsim.sim.cost.model import CostModel


def shifted(step_fn, extra: int):
    """``B -> step_fn(B + extra)``: the step time a policy sees when prefill tokens share it."""
    if isinstance(step_fn, TableStepTime):
        return TableStepTime(step_fn.fn, step_fn.table, extra)
    return lambda batch: step_fn(np.asarray(batch) + extra)


# Per trace row, what a step of a survival-ranking policy reads, side by side in one float64
# row: the survivals (cumprod of the confidences in float64), the confidences and accept_len.
# One gather per step then fetches all three (a step touches R scattered rows: one memory
# fetch per row instead of three). Built once per confidence array and kept while it lives: a
# sweep replays one trace many times.
_ROW_TABLES: dict[int, tuple[int, np.ndarray]] = {}


def _fingerprint(*arrays: np.ndarray) -> int:
    """CRC32 of the arrays' bytes (~1 ms per 4 MB): a table built from writeable arrays since
    changed in place is rebuilt, not reused."""
    crc = 0
    for a in arrays:
        crc = zlib.crc32(memoryview(np.ascontiguousarray(a)).cast("B"), crc)
    return crc


def row_table(conf: np.ndarray, accept_len: np.ndarray) -> np.ndarray:
    """(rows, 2 gamma + 1) float64: [survival | conf | accept_len]; exact (conf and accept_len
    convert back losslessly), cached per (live, unchanged) confidence array."""
    key = id(conf)
    # read-only arrays (read_trace's) cannot change in place: no need to look
    mutable = conf.flags.writeable or accept_len.flags.writeable
    crc = _fingerprint(conf, accept_len) if mutable else 0
    hit = _ROW_TABLES.get(key)
    if hit is not None and hit[0] == crc and hit[1].shape[0] == conf.shape[0]:
        return hit[1]
    table = np.concatenate(
        (
            np.cumprod(conf.astype(np.float64), axis=1),
            conf.astype(np.float64),
            accept_len.astype(np.float64)[:, None],
        ),
        axis=1,
    )
    if hit is None:
        weakref.finalize(conf, _ROW_TABLES.pop, key, None)
    _ROW_TABLES[key] = (crc, table)
    return table


# A 2-D profile's step time as plain Python floats up to this token batch (beyond: the cost
# model itself).
STEP2D_ROWS = 1 << 14


class Step2D:
    """``float(cost.step_time(batch, ctx))`` of a 2-D profile for one scalar batch, without
    numpy calls (~1 us instead of ~28 on every step of a 2-D replay).

    The same arithmetic as ``CostModel.step_time``: the context clipped to the table's range,
    the two neighbouring rows, ``(1 - w) * lo + w * hi``. The rows are read through the cost
    model itself at each row's own context (where w = 1 and the blend returns the row
    exactly), so only the blend is restated here; ``ok`` says whether it agrees with the cost
    model on a grid of batches and contexts (if it ever stops agreeing, the engine asks the
    cost model every step).
    """

    def __init__(self, cost: CostModel) -> None:
        self._cost = weakref.ref(cost)  # kept per cost model while it lives (_step2d)
        self.ctxs = [float(c) for c in np.asarray(cost.context_tokens)]
        grid = np.arange(STEP2D_ROWS)
        self.arrays = [np.asarray(cost.step_time(grid, c), np.float64) for c in self.ctxs]
        self.rows = [a.tolist() for a in self.arrays]
        lo, hi = self.ctxs[0], self.ctxs[-1]
        probe_ctx = [lo - 1.0, lo, (lo + hi) / 2, hi, hi + 7.5, lo + (hi - lo) / 3]
        probe_ctx += [lo + (hi - lo) * f for f in (0.01, 0.37, 0.999)] + [None]
        probe_b = [0, 1, 2, 7, 8, 63, 64, 300, int(cost.b_max), int(cost.b_max) + 5]
        probe_b += [STEP2D_ROWS - 1, STEP2D_ROWS + 3]
        self.ok = all(self(b, c) == float(cost.step_time(b, c)) for b in probe_b for c in probe_ctx)

    @property
    def cost(self) -> CostModel:
        cost = self._cost()
        if cost is None:  # cannot happen: an engine holds its cost model while it runs
            raise SpecsimError("internal: the cost model of a 2-D step table is gone")
        return cost

    def __call__(self, batch: int, ctx: float | None) -> float:
        """None: the smallest context's row (``step_time_fn(None)``, before any decode)."""
        if batch >= STEP2D_ROWS or batch < 0:
            return float(self.cost.step_time(batch, ctx))
        ctxs = self.ctxs
        if ctx is None:
            return self.rows[0][batch]
        c = ctxs[0] if ctx < ctxs[0] else ctxs[-1] if ctx > ctxs[-1] else ctx
        hi = bisect_left(ctxs, c)
        if hi == 0:
            return self.rows[0][batch]
        w = (c - ctxs[hi - 1]) / (ctxs[hi] - ctxs[hi - 1])
        return (1.0 - w) * self.rows[hi - 1][batch] + w * self.rows[hi][batch]

    def fn(self, ctx: float):  # noqa: ANN201 - a StepTime
        """``cost.step_time_fn(ctx)`` as a policy gets it: the same numbers, array in, array
        out, from the two rows and the blend (two takes and three ufuncs, not ~20 calls)."""
        ctxs = self.ctxs
        c = ctxs[0] if ctx < ctxs[0] else ctxs[-1] if ctx > ctxs[-1] else ctx
        hi = bisect_left(ctxs, c)
        if hi == 0:
            return _Blend2D(self.cost, ctx, self.arrays[0], None, 0.0)
        w = (c - ctxs[hi - 1]) / (ctxs[hi] - ctxs[hi - 1])
        return _Blend2D(self.cost, ctx, self.arrays[hi - 1], self.arrays[hi], w)


_STEP2D: dict[int, Step2D] = {}


def step2d(cost: CostModel) -> Step2D:
    """One ``Step2D`` per live cost model (a sweep replays one profile many times)."""
    hit = _STEP2D.get(id(cost))
    if hit is not None and hit._cost() is cost:
        return hit
    made = Step2D(cost)
    if hit is None:
        weakref.finalize(cost, _STEP2D.pop, id(cost), None)
    _STEP2D[id(cost)] = made
    return made


class _Blend2D:
    """A 2-D profile's ``B -> seconds`` at one context (see ``Step2D.fn``); batches beyond
    the dense rows go to the cost model."""

    __slots__ = ("cost", "ctx", "lo", "hi", "w")

    def __init__(self, cost, ctx, lo, hi, w) -> None:  # noqa: ANN001
        self.cost, self.ctx, self.lo, self.hi, self.w = cost, ctx, lo, hi, w

    def __call__(self, batch):  # noqa: ANN001, ANN204
        b = np.maximum(np.asarray(batch, dtype=np.int64), 0)
        if b.size and b.max() >= STEP2D_ROWS:
            return self.cost.step_time(np.asarray(batch), self.ctx)
        out = self.lo.take(b) if self.hi is None else (
            (1.0 - self.w) * self.lo.take(b) + self.w * self.hi.take(b)
        )  # fmt: skip
        return float(out) if np.ndim(batch) == 0 else out
