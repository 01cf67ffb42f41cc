"""The raw log of a simulated run: per-job arrays and the per-step table (``RawLog``), or, for
sweeps that read only the summary, the step table reduced to running sums (``StepSums``).

Metrics are derived from these by pure functions (:mod:`specsim.sim.metrics`). (specsim's own
torch engine wrote the same ``RawLog``, so both were measured alike; it was retired at commit
574e4c8.)
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass

import numpy as np

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
    # serving model v2: requests preempted (KV blocks ran out; recomputed on readmission), the
    # cached tokens they lost, and each job's longest gap between two of its tokens across a
    # preemption (a stall the step log's periods do not show)
    preemptions: int = 0
    recomputed_tokens: int = 0
    stall_s: np.ndarray | None = None


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


class RunningSums:
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
