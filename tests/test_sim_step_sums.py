"""The reduced step log (``record_steps=False``): what it keeps and how it finds the steady
window. Its summaries against the full log's, exactly, are in test_sim_golden_v2.py."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np

from specsim.sim.steplog import RunningSums as _Sums


def test_steps_started_before_counts_a_trailing_group_of_equal_starts():
    """Steps that start at the same time (a step too short to move the clock) all count as
    starting at t, not before it: the window rule is start >= t0 and start < t1."""
    s = _Sums()
    s.step(0.0, 1.0, 4, 4, 4, 0, 0, 4, 4)
    assert s.before(1.0) == (1, 4)
    s.step(1.0, 0.5, 4, 4, 0, 3, 2, 6, 7)
    s.step(1.0, 0.5, 4, 4, 0, 3, 1, 5, 7)  # same start: the clock did not move
    assert s.before(1.0) == (1, 4)
    assert s.before(1.5) == (3, 15)
    s.walk([0.25, 0.25, 0.25], 0.125, 4, 4, 6, 3, 12, 18)
    assert s.before(2.5) == (6, 27)
    frozen = s.freeze()
    assert frozen.n_steps == 6
    assert frozen.period_s.tolist() == [1.0, 0.5, 0.5, 0.375, 0.25, 0.25]
    assert frozen.decoding.tolist() == [4] * 6
    assert (frozen.emitted, frozen.prefilling, frozen.verified) == (27, 4, 12)
    assert (frozen.accepted, frozen.batch_tokens) == (6, 36)


def test_reduced_log_holds_16_bytes_a_step():
    """A sweep cell keeps O(running requests) state plus 16 bytes a step (a float64 period
    and two int32 counts), where the full log keeps 13 float64 values (104 bytes)."""
    from specsim.policies.base import get_policy
    from specsim.sim.cost.profiles import get_profile
    from specsim.sim.serving import Engine, EngineLimits
    from specsim.sim.workload import make_workload
    from specsim.trace.io import read_trace

    root = Path(__file__).resolve().parent.parent
    tr = read_trace(str(root / "traces" / "synthetic-chat.parquet"))
    cost = get_profile("v4-flash-8xh20")
    wl = make_workload(tr, concurrency=8, requests=40, seed=0)
    limits = EngineLimits(cost.max_running, cost.kv_tokens)
    eng = Engine(tr, get_policy("hw-aware"), cost, wl, limits, record_tokens=False,
                 record_steps=False)  # fmt: skip
    raw = eng.run()
    assert raw.step_log is None and raw.step_sums is not None
    held = sum(sys.getsizeof(a) for a in (eng.sums.period, eng.sums.in_sys, eng.sums.dec))
    steps = raw.step_sums.n_steps
    assert steps > 100 and held / steps < 20
    assert len(eng.log) == 0
    assert math.isfinite(float(np.sum(raw.step_sums.period_s)))
