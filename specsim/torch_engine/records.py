"""What the real engine records: a running request, the per-job records of a run that become
the simulator's :class:`~specsim.sim.steplog.RawLog`, and the run's result built from them by
the simulator's own metric functions (so both sides' metrics come from one function).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specsim.sim.steplog import STEP_COLUMNS, RawLog

# Breakdown of each step on the engine's clock, logged next to the simulator's step columns.
# ctx_mean: mean cached context (tokens) of the step's requests before the step; wall_start_s,
# wall_end_s: the step on the wall clock whatever the engine's clock (so that one closed-loop
# run gives both timelines, specsim.sim.steplog.retime).
TIMING_COLUMNS = (
    "admit_s",
    "draft_s",
    "sched_s",
    "verify_s",
    "accept_s",
    "ctx_mean",
    "wall_start_s",
    "wall_end_s",
)


@dataclass(frozen=True, eq=False)
class EngineResult:
    """Like :class:`specsim.sim.simulate.ReplayResult`, plus the generated token ids per job."""

    summary: dict
    requests: Any  # pandas.DataFrame, one row per job
    steps: Any  # pandas.DataFrame, one row per step (simulator columns + wall-clock breakdown)
    tokens: Any  # pandas.DataFrame, (job, time, tokens) emissions
    outputs: list[list[int]]  # generated ids per job
    config: dict = field(default_factory=dict)
    raw: RawLog | None = None


class Req:
    """A running request."""

    __slots__ = ("job", "slot", "n", "cap", "res", "prefilled", "h1", "h2", "out")

    def __init__(self, job: int, slot: int, cap: int, res: int) -> None:
        self.job, self.slot, self.cap, self.res = job, slot, cap, res
        self.n = 0  # output tokens committed
        self.prefilled = False
        self.h1: np.ndarray | None = None  # confidences of one decode step ago
        self.h2: np.ndarray | None = None  # ... two decode steps ago
        self.out: list[int] = []


class JobTable:
    """Per-job records of a run, one list each (appended as jobs arrive), turned into the
    simulator's :class:`RawLog` at the end."""

    def __init__(self, prompts: list[list[int]]) -> None:
        self.prompts = prompts
        self.trace: list[int] = []
        self.arrival: list[float] = []
        self.admitted: list[float] = []
        self.first: list[float] = []
        self.finish: list[float] = []
        self.prompt_len: list[int] = []
        self.out_len: list[int] = []
        self.steps: list[int] = []
        self.verified: list[int] = []
        self.accepted: list[int] = []
        self.outputs: list[list[int]] = []

    def add(self, t_idx: int, at: float, cap: int) -> int:
        self.trace.append(t_idx)
        self.arrival.append(at)
        for col in (self.admitted, self.first, self.finish):
            col.append(np.nan)
        self.prompt_len.append(len(self.prompts[t_idx]))
        self.out_len.append(cap)
        for col in (self.steps, self.verified, self.accepted):
            col.append(0)
        self.outputs.append([])
        return len(self.trace) - 1

    def raw_log(self, log, tok_job, tok_time, tok_cnt, max_b: int) -> RawLog:  # type: ignore[no-untyped-def]
        f64 = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
        i64 = lambda x: np.asarray(x, dtype=np.int64)  # noqa: E731
        done = np.isfinite(f64(self.finish))
        return RawLog(
            job_trace=i64(self.trace),
            arrival_s=f64(self.arrival),
            admitted_s=f64(self.admitted),
            first_token_s=f64(self.first),
            finish_s=f64(self.finish),
            prompt_len=i64(self.prompt_len),
            output_len=i64(self.out_len),
            emitted=np.where(done, i64(self.out_len), 0),
            steps=i64(self.steps),
            verified=i64(self.verified),
            accepted=i64(self.accepted),
            step_log=np.asarray(log, dtype=np.float64).reshape(-1, len(STEP_COLUMNS)),
            token_job=i64(tok_job),
            token_time=f64(tok_time),
            token_count=i64(tok_cnt),
            sim_time_s=float(log[-1][0] + log[-1][1]) if log else 0.0,
            max_batch_tokens=int(max_b),
        )


def engine_result(raw: RawLog, outputs: list[list[int]], timing: list[float], t_end: float,
                  n_jobs: int, config: dict) -> EngineResult:  # fmt: skip
    """The run's summary and frames, from the simulator's own metric functions, with the step
    breakdown on the engine's clock beside the simulator's step columns."""
    import pandas as pd

    from specsim.sim.metrics import request_frame, step_frame, summarize, token_frame

    steps = step_frame(raw)
    tim = np.asarray(timing, dtype=np.float64).reshape(-1, len(TIMING_COLUMNS))
    for k, name in enumerate(TIMING_COLUMNS):
        steps[name] = tim[:, k]
    return EngineResult(
        summary=summarize(raw, None, t_end),
        requests=request_frame(raw, np.arange(n_jobs, dtype=np.int64), None),
        steps=pd.DataFrame(steps),
        tokens=token_frame(raw),
        outputs=outputs,
        config=config,
        raw=raw,
    )
