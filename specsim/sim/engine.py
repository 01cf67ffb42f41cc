"""The SimPy serving engine: continuous batching of speculative decoding over a replayed trace.

One SimPy process runs the engine loop; under ZOS a second, short-lived process models the
scheduler running ahead on the CPU in each step it outlasts. All per-step work is vectorised
numpy over the running batch (arrays of trace offsets, positions, outputs), so a step costs the
same few dozen numpy calls whether 1 or 500 requests run. With one request in flight (or up to
``_ROWWISE_MAX_R`` under a rowwise policy) the steps up to the next event are walked in plain
Python without an event each (``Engine._solo_stretch``, ``Engine._rowwise_stretch``), with the
same clock, bit for bit.

One engine iteration (a "step"):

1. Admission (at the step's start time t): every open-loop arrival with time <= t joins the FIFO
   queue (so an arrival at exactly a step boundary joins the step that starts there: the
   same-time rule, tested); then queued requests are admitted, head first, while a running slot
   is free (``max_running``), the request's KV reservation (prompt_len + output_len + gamma
   tokens) fits in ``kv_tokens`` and its prompt fits in what is left of the step's
   ``prefill_budget`` (prompt tokens per step, like vLLM's max_num_batched_tokens; the first
   request of a step is admitted whatever its prompt). A request that does not fit blocks the
   queue (FIFO, no skipping). There is no preemption: an admitted request keeps its slot and
   reservation.
2. Prefill: requests admitted at this step add their prompt tokens to the step's token batch
   (chunked-prefill style). The prefill forward yields the first output token: trace position 0,
   verified with l = 0 (one token; no drafts exist yet, the drafter needs the prompt's features).
3. Decode, for the requests already prefilled: draft (``draft_ms(R, gamma)``), schedule (the
   policy returns l_r from the confidences of each request's current trace row), verify (one
   target step over B = sum(1 + l_r) + prefill tokens, ``step_time(B)``). Replay rule: request r
   at position n emits e = min(l_r, accept_len[n]) + 1 tokens, capped at output_len - n;
   n += e. All tokens of a step are emitted at the step's end.
4. Scheduler time. Serial (``policy.zos`` False): base + per-request * R is added to the step.
   ZOS: the decision for step t+1 is computed during step t by its own process; the engine
   waits for it only if it outlasts step t (the excess is logged as ``sched_wait_s``). The
   policy then sees ``lagged_conf``: each request's confidence row of two decode steps earlier
   (its current row if it is too new to have one). The first step after the engine was idle has
   nothing to overlap with and starts at once.

Online acceptance estimate (for policies that need ``accept_rate``): per draft position k, the
share of verified position-k drafts (reached: all earlier ones accepted) that were accepted,
with a prior of 0.5 worth ``PRIOR_WEIGHT`` observations.

Verification history (for policies that need ``accept_hist``): counts of reached and accepted
drafts by request class (the trace's category), position and confidence bin
(``HIST_BINS`` equal bins of [0, 1]), from steps that ENDED before the decision was made: under
ZOS, whose decision for step t runs during step t-1, the outcomes of step t-1 are withheld too.
"""

from __future__ import annotations

import math
import weakref
import zlib
from array import array
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass

import numpy as np
import simpy

from specsim.errors import SpecsimError
from specsim.policies.base import (
    Policy,
    StepInput,
    TableStepTime,
    check_lengths,
    checked_lengths,
    lengths_ok,
)
from specsim.rng import stream
from specsim.sim.cost import CostModel
from specsim.sim.workload import Workload
from specsim.trace.model import Trace

PRIOR_RATE = 0.5
PRIOR_WEIGHT = 2.0
HIST_BINS = 20

# Columns of the step log, in order.
STEP_COLUMNS = (
    "time_s",
    "duration_s",
    "batch_tokens",
    "running",
    "decoding",
    "prefilling",
    "queued",
    "prefill_tokens",
    "verified_drafts",
    "accepted_drafts",
    "emitted_tokens",
    "sched_wait_s",
    "finished",
)


@dataclass(frozen=True)
class EngineLimits:
    """Capacity of the simulated server."""

    max_running: int
    kv_tokens: int
    prefill_budget: int = 1 << 62  # prompt tokens admitted per step (the first always goes)


@dataclass(frozen=True, eq=False)
class RawLog:
    """Raw arrays of one run; metrics are derived from these by pure functions."""

    job_trace: np.ndarray  # (J,) trace request of each job
    arrival_s: np.ndarray
    admitted_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    prompt_len: np.ndarray
    output_len: np.ndarray  # tokens the job emits (capped target)
    emitted: np.ndarray  # tokens emitted by the end (== output_len when finished)
    steps: np.ndarray  # decode steps the job took part in
    verified: np.ndarray  # draft tokens verified
    accepted: np.ndarray  # draft tokens accepted
    step_log: np.ndarray | None  # (S, len(STEP_COLUMNS)) float64; None: not recorded
    token_job: np.ndarray | None  # emission log: job, time, count per (job, step)
    token_time: np.ndarray | None
    token_count: np.ndarray | None
    sim_time_s: float
    max_batch_tokens: int
    step_sums: StepSums | None = None  # what the summary needs when step_log is None


@dataclass(frozen=True, eq=False)
class StepSums:
    """The step log reduced to what the summary reads (``record_steps=False``).

    Integer totals are exact in any order, so they are kept as running sums. The summary's
    floating-point sums (time in system, mean ITL, the steady window) are numpy's pairwise sums
    over per-step values, whose rounding depends on the whole sequence and its length: to stay
    bit-identical to the full log, the per-step period and the two counts it is weighted by are
    kept (16 bytes a step where the full log takes 104). The steady window [t0, t1) is found as
    the run goes: ``window_start`` / ``window_end`` are (steps that started before t, tokens
    they emitted) at t0 (the C-th completion) and at t1 (the last admission).
    """

    period_s: np.ndarray  # (S,) float64: duration + sched_wait
    in_system: np.ndarray  # (S,) int32: running + queued at the step's start
    decoding: np.ndarray  # (S,) int32: decoding requests
    emitted: int
    prefilling: int
    verified: int
    accepted: int
    batch_tokens: int
    window_start: tuple[int, int] | None
    window_end: tuple[int, int] | None

    @property
    def n_steps(self) -> int:
        return int(self.period_s.shape[0])


class _Sums:
    """The running form of :class:`StepSums`, appended to step by step."""

    def __init__(self) -> None:
        self.period = array("d")
        self.in_sys = array("i")
        self.dec = array("i")
        self.n = self.emitted = self.prefilling = self.verified = self.accepted = self.batch = 0
        # the trailing steps that started at the same time (normally just the last one), so
        # "steps that started before t" is exact for any t at or after the last start
        self.last_start = math.nan
        self.trail = self.trail_emit = 0
        self.t0: tuple[int, int] | None = None
        self.t1: tuple[int, int] | None = None

    def step(self, start, period, in_sys, dec, new, ver, acc, emitted, batch) -> None:
        self.period.append(period)
        self.in_sys.append(in_sys)
        self.dec.append(dec)
        self.n += 1
        self.emitted += emitted
        self.prefilling += new
        self.verified += ver
        self.accepted += acc
        self.batch += batch
        if start == self.last_start:
            self.trail += 1
            self.trail_emit += emitted
        else:
            self.last_start = start
            self.trail = 1
            self.trail_emit = emitted

    def walk(self, durs, wait, in_sys, dec, ver, acc, emitted, batch) -> None:
        """Steps walked without SimPy (no admission, no prefill). Every walked step moves the
        clock (the walks stop before one that would not), so no later time equals a walked
        step's start: the trailing group is empty for every time asked afterwards."""
        k = len(durs)
        self.period.append(durs[0] + wait)
        self.period.extend(durs[1:])
        self.in_sys.extend(array("i", (in_sys,)) * k)
        self.dec.extend(array("i", (dec,)) * k)
        self.n += k
        self.emitted += emitted
        self.verified += ver
        self.accepted += acc
        self.batch += batch
        self.last_start = math.nan
        self.trail = self.trail_emit = 0

    def before(self, t: float) -> tuple[int, int]:
        """(steps that started before t, tokens they emitted), for t >= every start so far."""
        if t == self.last_start:
            return self.n - self.trail, self.emitted - self.trail_emit
        return self.n, self.emitted

    def freeze(self) -> StepSums:
        return StepSums(
            period_s=np.frombuffer(self.period, dtype=np.float64),
            in_system=np.frombuffer(self.in_sys, dtype=np.int32),
            decoding=np.frombuffer(self.dec, dtype=np.int32),
            emitted=self.emitted,
            prefilling=self.prefilling,
            verified=self.verified,
            accepted=self.accepted,
            batch_tokens=self.batch,
            window_start=self.t0,
            window_end=self.t1,
        )


# Rows of the running-batch state array.
# _STEPS holds the index of the request's first decode step until it finishes.
# _RES: the KV tokens the request reserved (prompt + output + gamma).
# _N, _VER, _ACC are adjacent: one in-place add advances all three after a step.
_JOB, _BASE, _N, _VER, _ACC, _OUT, _PROMPT, _H1, _H2, _STEPS, _RES = range(11)
_NF = 11

# Rows of a lone request's trace decided at once by the solo walk (a longer walk resumes).
_SOLO_ROWS = 512
# The walk of several requests under a rowwise policy: rows decided at once per request, and
# the most requests it takes (beyond, a numpy step is cheaper than a Python walk).
_ROWWISE_ROWS = 64
_ROWWISE_MAX_R = 32
# Up to this many requests a step's verification outcomes are counted in plain Python.
_HIST_PY_MAX_R = 4


def _shifted(step_fn, extra: int):
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
_STEP2D_ROWS = 1 << 14


class _Step2D:
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
        grid = np.arange(_STEP2D_ROWS)
        self.arrays = [np.asarray(cost.step_time(grid, c), np.float64) for c in self.ctxs]
        self.rows = [a.tolist() for a in self.arrays]
        lo, hi = self.ctxs[0], self.ctxs[-1]
        probe_ctx = [lo - 1.0, lo, (lo + hi) / 2, hi, hi + 7.5, lo + (hi - lo) / 3]
        probe_ctx += [lo + (hi - lo) * f for f in (0.01, 0.37, 0.999)] + [None]
        probe_b = [0, 1, 2, 7, 8, 63, 64, 300, int(cost.b_max), int(cost.b_max) + 5]
        probe_b += [_STEP2D_ROWS - 1, _STEP2D_ROWS + 3]
        self.ok = all(self(b, c) == float(cost.step_time(b, c)) for b in probe_b for c in probe_ctx)

    @property
    def cost(self) -> CostModel:
        cost = self._cost()
        if cost is None:  # cannot happen: an engine holds its cost model while it runs
            raise SpecsimError("internal: the cost model of a 2-D step table is gone")
        return cost

    def __call__(self, batch: int, ctx: float | None) -> float:
        """None: the smallest context's row (``step_time_fn(None)``, before any decode)."""
        if batch >= _STEP2D_ROWS or batch < 0:
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


_STEP2D: dict[int, _Step2D] = {}


def _step2d(cost: CostModel) -> _Step2D:
    """One ``_Step2D`` per live cost model (a sweep replays one profile many times)."""
    hit = _STEP2D.get(id(cost))
    if hit is not None and hit._cost() is cost:
        return hit
    made = _Step2D(cost)
    if hit is None:
        weakref.finalize(cost, _STEP2D.pop, id(cost), None)
    _STEP2D[id(cost)] = made
    return made


class _Blend2D:
    """A 2-D profile's ``B -> seconds`` at one context (see ``_Step2D.fn``); batches beyond
    the dense rows go to the cost model."""

    __slots__ = ("cost", "ctx", "lo", "hi", "w")

    def __init__(self, cost, ctx, lo, hi, w) -> None:  # noqa: ANN001
        self.cost, self.ctx, self.lo, self.hi, self.w = cost, ctx, lo, hi, w

    def __call__(self, batch):  # noqa: ANN001, ANN204
        b = np.maximum(np.asarray(batch, dtype=np.int64), 0)
        if b.size and b.max() >= _STEP2D_ROWS:
            return self.cost.step_time(np.asarray(batch), self.ctx)
        out = self.lo.take(b) if self.hi is None else (
            (1.0 - self.w) * self.lo.take(b) + self.w * self.hi.take(b)
        )  # fmt: skip
        return float(out) if np.ndim(batch) == 0 else out


class _Jobs:
    """Per-job arrays, grown by doubling (closed loop does not know its job count).

    ``cols`` holds each job's column of the running-batch array (fields ``_JOB`` .. ``_RES``),
    filled when the job is added: admission copies whole columns into the batch with one
    fancy index, and completion writes the finished columns back with another (the result
    fields then hold the final counters; ``_STEPS`` the decode steps taken).
    """

    FIELDS = (
        ("trace", np.int64, -1),
        ("arrival", np.float64, np.nan),
        ("admitted", np.float64, np.nan),
        ("first", np.float64, np.nan),
        ("finish", np.float64, np.nan),
        ("prompt", np.int64, 0),
        ("out", np.int64, 0),
    )

    def __init__(self, capacity: int, offsets: np.ndarray, gamma: int) -> None:
        self.n = 0
        self.cap = max(16, capacity)
        self.offsets = offsets
        self.gamma = gamma
        for name, dt, fill in self.FIELDS:
            setattr(self, name, np.full(self.cap, fill, dtype=dt))
        self.cols = np.zeros((_NF, self.cap), np.int64)

    def _grow(self) -> None:
        self.cap *= 2
        for name, dt, fill in self.FIELDS:
            old = getattr(self, name)
            new = np.full(self.cap, fill, dtype=dt)
            new[: old.shape[0]] = old
            setattr(self, name, new)
        cols = np.zeros((_NF, self.cap), np.int64)
        cols[:, : self.cols.shape[1]] = self.cols
        self.cols = cols

    def add(self, trace: int, arrival: float, prompt: int, out: int) -> int:
        if self.n == self.cap:
            self._grow()
        j = self.n
        self.trace[j] = trace
        self.arrival[j] = arrival
        self.prompt[j] = prompt
        self.out[j] = out
        col = [0] * _NF
        col[_JOB], col[_BASE], col[_OUT], col[_PROMPT] = j, int(self.offsets[trace]), out, prompt
        col[_H1] = col[_H2] = -1
        col[_RES] = prompt + out + self.gamma
        self.cols[:, j] = col
        self.n += 1
        return j

    def add_many(self, trace, arrival, prompt, out) -> None:
        """Bulk add (open loop: all jobs known up front)."""
        m = trace.shape[0]
        while self.n + m > self.cap:
            self._grow()
        s = slice(self.n, self.n + m)
        self.trace[s], self.arrival[s], self.prompt[s], self.out[s] = trace, arrival, prompt, out
        c = self.cols[:, s]
        c[_JOB] = np.arange(self.n, self.n + m)
        c[_BASE] = self.offsets[trace]
        c[_OUT], c[_PROMPT] = out, prompt
        c[_H1] = c[_H2] = -1
        c[_RES] = np.asarray(prompt) + np.asarray(out) + self.gamma
        self.n += m

    def result(self, field: int) -> np.ndarray:
        """A finished job's counter (0 for a job that never finished), jobs 0..n-1."""
        done = ~np.isnan(self.finish[: self.n])
        return np.where(done, self.cols[field, : self.n], 0)


class Engine:
    """Replays ``trace`` under ``workload`` with ``policy`` on ``cost``. Call :meth:`run`."""

    def __init__(
        self,
        trace: Trace,
        policy: Policy,
        cost: CostModel,
        workload: Workload,
        limits: EngineLimits,
        *,
        record_tokens: bool = True,
        record_steps: bool = True,
        progress=None,
        env: simpy.Environment | None = None,
        seed: int = 0,
    ) -> None:
        self.trace = trace
        self.policy = policy
        # the policy's own seeded stream (StepInput.rng): a random policy draws from it only
        self.policy_rng = stream(seed, "policy")
        self.cost = cost
        self.wl = workload
        self.limits = limits
        self.env = env if env is not None else simpy.Environment()
        self.record_tokens = record_tokens
        self.record_steps = record_steps
        self.progress = progress
        self.gamma = trace.block_size
        self._draft_lut: list[float] | None = None  # set with the cost terms in the run
        self.conf = trace.conf
        self.accept_len = trace.accept_len.astype(np.int64)
        self.offsets = trace.offsets.astype(np.int64)
        self.needs = policy.needs
        self._check_capacity()

    # ------------------------------------------------------------------ setup

    def _check_capacity(self) -> None:
        if self.limits.max_running < 1:
            raise SpecsimError(f"--max-running must be >= 1, got {self.limits.max_running}")
        res = self.wl.prompt_len + self.wl.output_len + self.gamma
        if self.wl.open_loop:
            worst = int(res.max()) if res.size else 0
        else:
            worst = int((self.wl.prompt_len + self.wl.output_len).max()) + self.gamma
        if worst > self.limits.kv_tokens:
            raise SpecsimError(
                f"a request needs {worst} KV tokens but --kv-tokens is {self.limits.kv_tokens}; "
                "raise --kv-tokens"
            )

    def _init_hist(self) -> None:
        """Class of every trace row, and empty (class, position, bin, [reached, accepted])."""
        tr = self.trace
        cats = tr.category if tr.category is not None else np.zeros(tr.n_requests, object)
        _, cls = np.unique(cats.astype(str), return_inverse=True)
        self.row_class = np.repeat(cls.astype(np.int64), np.diff(self.offsets))
        shape = (int(cls.max()) + 1 if cls.size else 1, self.gamma, HIST_BINS, 2)
        self.hist = np.zeros(shape, dtype=np.float64)  # what decisions may see
        # the last step's outcomes (ZOS: not seen yet), as the flat cells they add one to
        self.hist_pending = np.zeros(0, dtype=np.int64)
        self.hist_k = np.arange(self.gamma)

    def _hist_add(self, rows: np.ndarray, conf: np.ndarray, lens, a_ok) -> None:
        """Count this step's outcomes: draft k (0-based) of a request was reached iff
        k <= a_ok and k < lens, and accepted iff k < a_ok."""
        gamma = self.gamma
        if rows.shape[0] <= _HIST_PY_MAX_R:
            cells = self._hist_cells_py(rows, conf, lens, a_ok)
            if cells is not None:
                flat = self.hist.reshape(-1)
                if self.policy.zos:
                    for c in self.hist_pending:
                        flat[c] += 1.0
                    self.hist_pending = cells
                else:
                    for c in cells:
                        flat[c] += 1.0
                return
        k = self.hist_k
        reached = k < np.minimum(a_ok + 1, lens)[:, None]
        accepted = k < a_ok[:, None]
        b = np.minimum((conf.astype(np.float64) * HIST_BINS).astype(np.int64), HIST_BINS - 1)
        b = np.maximum(b, 0)
        cell = ((self.row_class[rows][:, None] * gamma + k) * HIST_BINS + b) * 2
        # one per reached draft, one per accepted (the cell next to it): whole counts, exact
        # in float64 whatever the order they are added in
        cells = np.concatenate((cell[reached], cell[accepted] + 1))
        flat = self.hist.reshape(-1)  # a view: hist is contiguous
        if self.policy.zos:  # the run-ahead decision of the next step cannot see this step yet
            np.add.at(flat, np.asarray(self.hist_pending, dtype=np.int64), 1.0)
            self.hist_pending = cells
        else:
            np.add.at(flat, cells, 1.0)

    def _hist_cells_py(self, rows, conf, lens, a_ok) -> list[int] | None:
        """``_hist_add``'s cells for a few requests in plain Python (a dozen numpy calls cost
        more than the whole loop): the same bins (int() truncates as astype does), the same
        cells. None for a confidence int() cannot take (NaN): the array path then."""
        gamma = self.gamma
        cls = self.row_class[rows].tolist()
        cells: list[int] = []
        try:
            for c, cf, ln, a in zip(cls, conf.tolist(), lens.tolist(), a_ok.tolist(), strict=True):
                base = c * gamma
                for k in range(min(a + 1, ln)):
                    b = int(float(cf[k]) * HIST_BINS)
                    b = 0 if b < 0 else HIST_BINS - 1 if b > HIST_BINS - 1 else b
                    cell = ((base + k) * HIST_BINS + b) * 2
                    cells.append(cell)
                    if k < a:
                        cells.append(cell + 1)
        except (ValueError, OverflowError):
            return None
        return cells

    # ------------------------------------------------------------------ run

    def run(self) -> RawLog:
        env = self.env
        self.jobs = _Jobs(self.wl.n_jobs_hint(), self.offsets, self.gamma)
        self.queue: deque[int] = deque()
        # The step log, columnar: one flat float64 buffer holding a row of len(STEP_COLUMNS)
        # values per step (8 bytes a value, no Python objects: 104 bytes a step, where a list
        # of tuples took ~400). Without record_steps only what the summary reads is kept
        # (_Sums: 16 bytes a step).
        self.log = array("d")
        self.sums = None if self.record_steps else _Sums()
        self.closed_c = self.wl.concurrency if self.wl.kind == "closed" else None
        self.n_steps = 0
        self.tok_job: list[np.ndarray] = []
        self.tok_cnt: list[np.ndarray] = []
        self.tok_time: list[float] = []
        self.tok_len: list[int] = []
        self.trials = np.zeros(self.gamma + 1, dtype=np.int64)
        self.succ = np.zeros(self.gamma + 1, dtype=np.int64)
        if "accept_hist" in self.needs:
            self._init_hist()
        self.max_b = 0
        self.n_done = 0
        wl = self.wl
        if wl.open_loop:
            self.jobs.add_many(wl.trace_idx, wl.arrival_s, wl.prompt_len, wl.output_len)
            self.n_arrived = 0
        else:
            self.n_started = 0
            first = wl.concurrency if wl.max_jobs is None else min(wl.concurrency, wl.max_jobs)
            for _ in range(first):
                self._spawn(0.0)
        proc = env.process(self._loop(env))
        env.run(until=proc)
        return self._raw()

    def _spawn(self, now: float) -> None:
        """Closed loop: the next job arrives now (if the bounds allow)."""
        wl = self.wl
        if wl.max_jobs is not None and self.n_started >= wl.max_jobs:
            return
        if wl.duration is not None and now > wl.duration:
            return
        t, p, o = wl.job(self.n_started)
        self.n_started += 1
        self.queue.append(self.jobs.add(t, now, p, o))

    def _zos_sched(self, env: simpy.Environment, seconds: float):
        yield env.timeout(seconds)

    def _log_step(self, row: tuple) -> None:
        """Append one step's row (``STEP_COLUMNS`` order) to the columnar log."""
        self.n_steps += 1
        self.log.extend(row)

    @staticmethod
    def _exact_delay(now: float, t: float) -> float | None:
        """A delay d with now + d == t in floating point, or None.

        SimPy adds the delay to the clock; t - now can miss t by an ulp, and when the rounding
        of now + d ties, some t are not reachable in one addition at all (the step-by-step path
        reached them by several). Neighbours of t - now are tried; None: no single hop exists.
        """
        d = t - now
        for _ in range(4):
            got = now + d
            if got == t:
                return d
            d = math.nextafter(d, math.inf if got < t else 0.0)
        return None

    def _draft_s(self, n: int) -> float:
        """Seconds of drafting for ``n`` decoding requests, before the context term."""
        lut = self._draft_lut
        if lut is None:
            return self.d_base + (self.d_req + self.d_tok) * n
        if n < len(lut):
            return lut[n]
        return float(self.cost.draft_ms(n, self.gamma)) * 1e-3

    def _checked_solo(self, lens: np.ndarray, n: int) -> list[int]:
        """A solo walk's lengths for n rows, checked like every step's (then as Python ints)."""
        gamma = int(self.conf.shape[1])
        if not lengths_ok(lens, n, gamma):
            inp = StepInput(conf=np.zeros((n, gamma)), step_time=lambda b: b)
            lens = check_lengths(np.asarray(lens), inp, self.policy.name)
        return lens.tolist()

    def _solo_stretch(self, S: np.ndarray, now: float, wait: float, n_queued: int, step_fn):
        """Steps of a lone running request up to the next event, walked without SimPy.

        With one request in flight and nothing to admit, no admission, arrival or completion
        can happen until the request finishes (or, open loop, the next arrival is due), so the
        steps in between are a deterministic walk: each step's length comes from the policy's
        ``solo`` decision of one trace row, computed for every row at once. The walk stops
        before the request's last step and before the step an arrival joins, which go through
        the ordinary step (completion, spawning, ZOS process). Every time is the same sum of
        the same floats as the step-by-step path, so results are bit-identical (golden test).

        Returns the walked steps' durations (empty when no step could be walked) and the end
        time of the last one.
        """
        b, pos, out = int(S[_BASE, 0]), int(S[_N, 0]), int(S[_OUT, 0])
        h1, h2 = int(S[_H1, 0]), int(S[_H2, 0])
        lagged = self.policy.solo_lagged
        hi = min(b + out, b + pos + _SOLO_ROWS)  # rows decided now; a longer walk resumes
        lo = b + pos
        if lagged:
            lo = min(x for x in (lo, h1, h2) if x >= 0)
        try:
            lens = self.policy.solo(self.conf[lo:hi], self.accept_len[lo:hi], step_fn)
        except ValueError:
            return [], now
        lens = self._checked_solo(lens, hi - lo)
        acc = self.accept_len[lo:hi].tolist()
        cost = self.cost
        lut = self.lut
        n_lut = len(lut)
        zos = bool(self.policy.zos)
        draft_s = self._draft_s(1)
        sched_s = 0.0 if zos else cost.sched_s(1)
        d0 = draft_s + sched_s
        zos_s = cost.sched_s(1) if zos else 0.0
        next_arrival = math.inf
        if self.wl.open_loop and self.n_arrived < self.wl.arrival_s.shape[0]:
            next_arrival = float(self.wl.arrival_s[self.n_arrived])
        record_tokens = self.record_tokens
        durs: list[float] = []
        ends: list[float] = []
        emits: list[int] = []
        t = now
        wait0 = wait
        ver = n_acc = 0
        max_b = self.max_b
        log = self.log if self.sums is None else None
        pos0 = pos
        while True:
            r = b + pos
            if r >= hi:
                break
            ln = lens[(h2 if (lagged and h2 >= 0) else r) - lo]
            a = ln if ln < acc[r - lo] else acc[r - lo]
            e = a + 1 if a + 1 < out - pos else out - pos
            if pos + e >= out:
                break  # the request's last step: the ordinary path finishes it
            batch = 1 + ln
            verify_s = lut[batch] if batch < n_lut else float(cost.step_time(batch))
            d = d0 + verify_s
            if zos_s > d:
                break  # the overlapped scheduler would outlast the step: step by step
            end = t + d
            if end <= t:
                break  # a step too short to move the clock: step by step (_Sums.walk)
            if log is not None:
                log.extend((t, d, batch, 1, 1, 0, n_queued, 0, ln, a, e, wait, 0))
            wait = 0.0
            durs.append(d)
            if batch > max_b:
                max_b = batch
            ver += ln
            n_acc += a
            pos += e
            h2, h1 = h1, r
            t = end
            if record_tokens:
                ends.append(end)
                emits.append(e)
            if end >= next_arrival:
                break  # the next step starts with an arrival
        if not durs:
            return durs, now
        k = len(durs)
        self.n_steps += k
        if self.sums is not None:
            self.sums.walk(durs, wait0, 1 + n_queued, 1, ver, n_acc, pos - pos0, k + ver)
        self.max_b = max_b
        S[_N, 0] = pos
        S[_VER, 0] += ver
        S[_ACC, 0] += n_acc
        S[_H1, 0], S[_H2, 0] = h1, h2
        if record_tokens:
            k = len(ends)
            self.tok_job.append(np.full(k, S[_JOB, 0], np.int64))
            self.tok_cnt.append(np.asarray(emits, np.int64))
            self.tok_time.extend(ends)
            self.tok_len.extend([1] * k)
        return durs, t

    def _rowwise_stretch(self, S: np.ndarray, now: float, wait: float, n_queued: int, step_fn):
        """Steps of R running requests up to the next event, walked without SimPy, for a policy
        whose decision for a request reads that request's row only (``Policy.rowwise``: the
        static lengths, thresholds, the oracle).

        As in ``_solo_stretch``: with nothing to admit, nothing happens until a request finishes
        or an arrival is due, so each request walks its own rows (decided at once by
        ``Policy.solo``) and a step's batch is the sum of the requests' lengths. The walk stops
        before the first step in which a request would finish (or run out of decided rows) and
        before the step an arrival joins. In plain Python this costs well under a microsecond
        per request-step, against a few dozen numpy calls per step: used up to
        ``_ROWWISE_MAX_R`` requests. Same floats in the same order: bit-identical results.
        """
        n = S.shape[1]
        pos = S[_N].tolist()
        out = S[_OUT].tolist()
        span = np.minimum(S[_OUT] - S[_N], _ROWWISE_ROWS)
        first = np.cumsum(span) - span  # where each request's rows start in the flat list
        rows = np.arange(int(span.sum())) + np.repeat(S[_BASE] + S[_N] - first, span)
        try:
            lens = self.policy.solo(self.conf[rows], self.accept_len[rows], step_fn)
        except ValueError:
            return [], now
        lens = self._checked_solo(lens, rows.shape[0])
        acc = self.accept_len[rows].tolist()
        # index of each request's current row in the flat lists, and the end of its rows
        at = first.tolist()
        stop = (first + span).tolist()
        cost = self.cost
        lut = self.lut
        n_lut = len(lut)
        d0 = self._draft_s(n) + cost.sched_s(n)
        next_arrival = math.inf
        if self.wl.open_loop and self.n_arrived < self.wl.arrival_s.shape[0]:
            next_arrival = float(self.wl.arrival_s[self.n_arrived])
        record_tokens = self.record_tokens
        ver = [0] * n
        acc_n = [0] * n
        durs: list[float] = []
        ends: list[float] = []
        emits: list[int] = []
        t = now
        wait0 = wait
        max_b = self.max_b
        log = self.log if self.sums is None else None
        idx = range(n)
        while True:
            step_l = []
            step_a = []
            step_e = []
            for i in idx:
                k = at[i]
                if k >= stop[i]:
                    break
                ln = lens[k]
                a = ln if ln < acc[k] else acc[k]
                left = out[i] - pos[i]
                if a + 1 >= left:
                    break  # request i would finish: the ordinary path takes this step
                step_l.append(ln)
                step_a.append(a)
                step_e.append(a + 1)
            if len(step_e) < n:
                break
            n_ver = sum(step_l)
            batch = n + n_ver
            verify_s = lut[batch] if batch < n_lut else float(cost.step_time(batch))
            d = d0 + verify_s
            end = t + d
            if end <= t:
                break  # a step too short to move the clock: step by step (_Sums.walk)
            if log is not None:
                row = (t, d, batch, n, n, 0, n_queued, 0, n_ver, sum(step_a), sum(step_e), wait, 0)
                log.extend(row)
            wait = 0.0
            durs.append(d)
            if batch > max_b:
                max_b = batch
            for i in idx:
                e = step_e[i]
                pos[i] += e
                at[i] += e
                ver[i] += step_l[i]
                acc_n[i] += step_a[i]
            t = end
            if record_tokens:
                ends.append(end)
                emits.extend(step_e)
            if end >= next_arrival:
                break  # the next step starts with an arrival
        if not durs:
            return durs, now
        k = len(durs)
        self.n_steps += k
        if self.sums is not None:
            v = sum(ver)
            emitted = sum(pos) - int(S[_N].sum())
            self.sums.walk(durs, wait0, n + n_queued, n, v, sum(acc_n), emitted, n * k + v)
        self.max_b = max_b
        S[_N] = pos
        S[_VER] += ver
        S[_ACC] += acc_n
        if record_tokens:
            k = len(ends)
            self.tok_job.append(np.tile(S[_JOB], k))
            self.tok_cnt.append(np.asarray(emits, np.int64))
            self.tok_time.extend(ends)
            self.tok_len.extend([n] * k)
        return durs, t

    def _loop(self, env: simpy.Environment):
        jobs = self.jobs
        cost = self.cost
        gamma = self.gamma
        conf_all = self.conf
        acc_all = self.accept_len
        lut = cost.lut_seconds(None)
        # Python floats for the walks, which index it per step; they never batch more than
        # _ROWWISE_MAX_R x (1 + gamma) tokens (beyond, they ask the cost model: same numbers)
        self.lut = lut[: (_ROWWISE_MAX_R + 1) * (gamma + 1) + 1].tolist()
        n_lut = lut.shape[0]
        step_fn = cost.step_time_fn(None)
        if not cost.is_2d:  # policies may read runs of batch sizes as table slices
            step_fn = TableStepTime(step_fn, lut)
        d_base, d_req = cost.draft_base_ms * 1e-3, cost.draft_per_request_ms * 1e-3
        d_tok = cost.draft_per_token_ms * 1e-3 * gamma
        self.d_base, self.d_req, self.d_tok = d_base, d_req, d_tok
        # a measured draft curve: seconds at every R up to max_running, looked up per step
        self._draft_lut = None
        if cost.draft_curve:
            n_max = min(int(cost.max_running), 1 << 16)
            self._draft_lut = (cost.draft_ms(np.arange(n_max + 1), gamma) * 1e-3).tolist()
        draft_lut = self._draft_lut
        # measured-engine terms (specsim.sim.cost): 0 in generated profiles
        engine_terms = cost.has_engine_terms
        step2d = _step2d(cost) if cost.is_2d and not engine_terms else None
        if step2d is not None and not step2d.ok:
            step2d = None
        ctx = None  # a 2-D profile's context, set by each step that decodes (as step_fn is)
        p_tok = cost.prefill_token_ms * 1e-3
        zos = bool(self.policy.zos)
        schedule = self.policy.schedule
        need_lag = "lagged_conf" in self.needs
        need_rate = "accept_rate" in self.needs
        need_acc = "accept_len" in self.needs
        need_hist = "accept_hist" in self.needs
        need_surv = "survival" in self.needs
        need_lag_surv = need_lag and "lagged_survival" in self.needs
        # survivals of every trace row, once: a step gathers its rows instead of a cumprod
        tab = row_table(conf_all, acc_all) if need_surv or need_lag_surv else None
        conf_dtype = conf_all.dtype
        # the solo walk needs a step time that does not move with the context (1-D profile)
        solo = self.policy.solo is not None and not cost.is_2d and not engine_terms
        rowwise = solo and self.policy.rowwise and not zos
        open_loop = self.wl.open_loop
        arrivals = self.wl.arrival_s
        n_arr_total = arrivals.shape[0] if open_loop else 0
        kv_cap = self.limits.kv_tokens
        max_run = self.limits.max_running
        # The running batch: one (FIELDS, R) int64 array, columns in admission order, so one
        # fancy index compacts every field at once. Prefilling requests sit at the end.
        S = np.zeros((_NF, 0), np.int64)
        kv_used = 0
        zos_proc = None
        queue = self.queue
        record = self.record_tokens
        progress = self.progress
        log_step = self._log_step
        sums = self.sums
        closed_c = self.closed_c
        while True:
            now = env.now
            # -- arrivals up to now join the queue (same-time rule: t_arrival <= now)
            if open_loop and self.n_arrived < n_arr_total and arrivals[self.n_arrived] <= now:
                upto = int(np.searchsorted(arrivals, now, side="right"))
                queue.extend(range(self.n_arrived, upto))
                self.n_arrived = upto
            # -- admission, FIFO, no skipping
            n_new = 0
            if queue and S.shape[1] < max_run:
                adm = []
                room = max_run - S.shape[1]
                budget = self.limits.prefill_budget
                while queue and room:
                    j = queue[0]
                    p = int(jobs.prompt[j])
                    res = p + int(jobs.out[j]) + gamma
                    if kv_used + res > kv_cap or (adm and p > budget):
                        break
                    queue.popleft()
                    kv_used += res
                    budget -= p
                    adm.append(j)
                    room -= 1
                if adm:
                    a = np.asarray(adm, dtype=np.int64)
                    n_new = a.shape[0]
                    jobs.admitted[a] = now
                    block = jobs.cols[:, a]
                    block[_STEPS] = self.n_steps + 1  # first decode step index (after prefill)
                    S = np.concatenate((S, block), axis=1)
                    if sums is not None:  # the steady window ends at the last admission
                        sums.t1 = sums.before(now)
            n_run = S.shape[1]
            n_queued = len(queue)
            if n_run == 0:
                zos_proc = None
                if queue:  # cannot happen: _check_capacity guarantees a lone request fits
                    raise SpecsimError("internal: queue blocked with an empty engine")
                if open_loop and self.n_arrived < n_arr_total:
                    yield env.timeout(float(arrivals[self.n_arrived]) - now)
                    continue
                return
            # -- ZOS: wait for the scheduler process that ran during the previous step
            wait = 0.0
            if zos and zos_proc is not None and not zos_proc.processed:
                yield zos_proc
                wait = env.now - now
                now = env.now
            n_dec = n_run - n_new
            # -- one request and nothing to admit: walk its steps up to the next event
            if solo and n_new == 0 and (n_run == 1 or (rowwise and n_run <= _ROWWISE_MAX_R)):
                if n_run == 1:
                    durs, end = self._solo_stretch(S, now, wait, n_queued, step_fn)
                else:
                    durs, end = self._rowwise_stretch(S, now, wait, n_queued, step_fn)
                if durs:
                    hop = self._exact_delay(now, end)
                    if hop is not None:  # one event to the next one that matters
                        yield env.timeout(hop)
                    else:  # no single hop lands on the same clock: one event per step
                        for d in durs:
                            yield env.timeout(d)
                    zos_proc = None  # the walk's last scheduler decision finished in its step
                    continue
            prefill_tokens = int(S[_PROMPT, n_dec:].sum()) if n_new else 0
            # -- decode part: schedule and replay
            if n_dec:
                pos = S[_N, :n_dec]
                rows = S[_BASE, :n_dec] + pos
                surv = None
                if tab is not None:  # one gather: [survival | conf | accept_len]
                    g = tab[rows]
                    conf = g[:, gamma : 2 * gamma].astype(conf_dtype)
                    acc = g[:, 2 * gamma].astype(np.int64)
                    if need_surv:
                        surv = g[:, :gamma]
                else:
                    conf = conf_all[rows]
                    acc = acc_all[rows]
                if cost.is_2d:
                    # np.mean's own arithmetic (a float64 sum, then / count) without its
                    # Python wrappers: the same context to the bit
                    ctx = float(np.add.reduce(S[_PROMPT] + S[_N], dtype=np.float64) / n_run)
                    step_fn = step2d.fn(ctx) if step2d is not None else cost.step_time_fn(ctx)
                if not n_new:
                    pol_fn = step_fn
                elif p_tok:
                    pol_fn = cost.policy_step_fn(step_fn, prefill_tokens)
                else:
                    pol_fn = _shifted(step_fn, prefill_tokens)
                lag = lag_surv = None
                if need_lag:
                    h2 = S[_H2, :n_dec]
                    lag_rows = np.where(h2 >= 0, h2, rows)
                    if need_lag_surv:
                        g = tab[lag_rows]
                        lag = g[:, gamma : 2 * gamma].astype(conf_dtype)
                        lag_surv = g[:, :gamma]
                    else:
                        lag = conf_all[lag_rows]
                rate = None
                if need_rate:
                    t = self.trials[1:].astype(np.float64)
                    rate = (self.succ[1:] + PRIOR_RATE * PRIOR_WEIGHT) / (t + PRIOR_WEIGHT)
                inp = StepInput(
                    conf=conf,
                    step_time=pol_fn,
                    lagged_conf=lag,
                    accept_rate=rate,
                    accept_len=acc if need_acc else None,
                    survival=surv,
                    lagged_survival=lag_surv,
                    rng=self.policy_rng,
                    accept_hist=self.hist if need_hist else None,
                    request_class=self.row_class[rows] if need_hist else None,
                )
                lens = checked_lengths(schedule(inp), inp, self.policy.name)
                a_ok = np.minimum(lens, acc)
                emit = np.minimum(a_ok + 1, S[_OUT, :n_dec] - pos)
                upd = np.array((emit, lens, a_ok), dtype=np.int64)  # rows _N, _VER, _ACC
                emitted, n_ver, n_acc = np.add.reduce(upd, axis=1).tolist()
                if need_rate:
                    reach = np.minimum(a_ok + 1, lens)
                    self.trials += np.bincount(reach, minlength=gamma + 1)[::-1].cumsum()[::-1]
                    self.succ += np.bincount(a_ok, minlength=gamma + 1)[::-1].cumsum()[::-1]
                if need_hist:
                    self._hist_add(rows, conf, lens, a_ok)
                if draft_lut is None:
                    draft_s = d_base + (d_req + d_tok) * n_dec
                else:
                    draft_s = self._draft_s(n_dec)
                if engine_terms:  # the drafter's context: up to the anchor (prompt + n - 1)
                    draft_s += cost.draft_context_s(S[_PROMPT, :n_dec] + pos - 1)
                sched_s = 0.0 if zos else cost.sched_s(n_dec)
            else:
                n_ver = n_acc = 0
                draft_s = sched_s = 0.0
            batch = n_dec + n_ver + prefill_tokens
            if batch > self.max_b:
                self.max_b = batch
            if engine_terms:
                verify_s = cost.verify_s(n_dec + n_ver, prefill_tokens, n_run, step_fn)
            elif step2d is not None:
                verify_s = step2d(batch, ctx)
            elif cost.is_2d:
                verify_s = float(step_fn(batch))
            elif batch < n_lut:
                verify_s = float(lut[batch])
            else:
                verify_s = float(cost.step_time(batch))
            duration = draft_s + sched_s + verify_s
            if zos:
                # The decision for the next step runs on the CPU during this one. A scheduler
                # shorter than the step ends first (now + sched <= now + duration, rounding is
                # monotone) and the next step never waits for it: only a longer one needs its
                # process (and an equal one only costs a zero wait), so only those get one.
                zos_s = cost.sched_s(n_run)
                zos_proc = env.process(self._zos_sched(env, zos_s)) if zos_s >= duration else None
            yield env.timeout(duration)
            end = env.now
            # -- advance
            if n_dec:
                S[_N : _ACC + 1, :n_dec] += upd
                if need_lag:
                    S[_H2, :n_dec] = S[_H1, :n_dec]
                    S[_H1, :n_dec] = rows
            else:
                emitted = 0
            if n_new:
                S[_N, n_dec:] = 1
                jobs.first[S[_JOB, n_dec:]] = end
                emitted += n_new
            if record:
                self.tok_job.append(S[_JOB].copy())
                self.tok_cnt.append(
                    np.concatenate((emit, np.ones(n_new, np.int64)))
                    if n_dec
                    else np.ones(n_run, np.int64)
                )
                self.tok_time.append(end)
                self.tok_len.append(n_run)
            done = S[_N] >= S[_OUT]
            n_fin = 0
            if done.any():
                fin = S[:, done]
                n_fin = fin.shape[1]
                fj = fin[_JOB]
                jobs.finish[fj] = end
                # a running request takes part in every step from its first decode step on
                fin[_STEPS] = self.n_steps + 1 - fin[_STEPS]
                jobs.cols[:, fj] = fin  # the counters, read back by _raw
                kv_used -= int(fin[_RES].sum())
                S = S[:, ~done]
                self.n_done += n_fin
                if progress is not None:
                    progress.update(n_fin)
                if not open_loop:
                    for _ in range(n_fin):
                        self._spawn(end)
            if sums is None:
                log_step(
                    (
                        now,
                        duration,
                        batch,
                        n_run,
                        n_dec,
                        n_new,
                        n_queued,
                        prefill_tokens,
                        n_ver,
                        n_acc,
                        emitted,
                        wait,
                        n_fin,
                    )
                )
            else:
                self.n_steps += 1
                sums.step(
                    now, duration + wait, n_run + n_queued, n_dec, n_new, n_ver, n_acc, emitted,
                    batch,
                )  # fmt: skip
                # the steady window starts at the C-th completion
                if closed_c is not None and sums.t0 is None and self.n_done >= closed_c:
                    sums.t0 = sums.before(end)

    # ------------------------------------------------------------------ output

    def _raw(self) -> RawLog:
        j = self.jobs
        n = j.n
        running = np.isnan(j.finish[:n]) & ~np.isnan(j.admitted[:n])
        if np.any(running):  # cannot happen: the loop drains every admitted job
            raise SpecsimError("internal: a request was left running")
        if self.record_tokens and self.tok_job:
            tj = np.concatenate(self.tok_job)
            tc = np.concatenate(self.tok_cnt)
            tt = np.repeat(np.asarray(self.tok_time), np.asarray(self.tok_len))
        else:
            tj = tc = tt = None
        if self.sums is None:
            log = np.frombuffer(self.log, dtype=np.float64).reshape(-1, len(STEP_COLUMNS)).copy()
            sums = None
        else:
            log, sums = None, self.sums.freeze()
        return RawLog(
            job_trace=j.trace[:n].copy(),
            arrival_s=j.arrival[:n].copy(),
            admitted_s=j.admitted[:n].copy(),
            first_token_s=j.first[:n].copy(),
            finish_s=j.finish[:n].copy(),
            prompt_len=j.prompt[:n].copy(),
            output_len=j.out[:n].copy(),
            emitted=j.result(_OUT),
            steps=j.result(_STEPS),
            verified=j.result(_VER),
            accepted=j.result(_ACC),
            step_log=log,
            token_job=tj,
            token_time=tt,
            token_count=tc,
            sim_time_s=float(self.env.now),
            max_batch_tokens=int(self.max_b),
            step_sums=sums,
        )
