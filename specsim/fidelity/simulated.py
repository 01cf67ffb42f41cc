"""The simulated side of a fidelity grid: every cell replayed with the engine's measured
profile (both clocks), the open-loop rates, and the per-step decomposition of a real run
against the cost model's terms."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from specsim.fidelity.config import Cell, cell_jobs
from specsim.fidelity.metrics import cell_metrics


def simulate_grid(grid: list[Cell], per: dict, requests: int | None, seed: int):  # type: ignore[no-untyped-def]
    """Simulated metrics of every cell on both clocks, and the open-loop rates (req/s): a
    fraction of the policy's simulated capacity (closed loop at the grid's largest C)."""
    from specsim.sim.simulate import replay

    c_max = max((c.concurrency for c in grid if c.concurrency is not None), default=8)
    rates: dict[Cell, float] = {}
    sims: dict[Cell, dict[str, Any]] = {}
    for c in grid:
        info = per[c.drafter]
        tr, jobs = info["trace"], cell_jobs(c, requests, info["trace"])
        kw: dict[str, Any] = {"requests": jobs, "seed": seed, "record_tokens": False}
        if c.concurrency is not None:
            kw["concurrency"] = c.concurrency
        else:
            cap = replay(tr, c.policy, concurrency=c_max, profile=info["cost"], **kw)
            per_job = float(np.mean(tr.output_len))
            rates[c] = round(c.rate_frac * cap.summary["throughput_tok_s"] / per_job, 4)
            kw["rate"] = rates[c]
        res = replay(tr, c.policy, profile=info["cost"], **kw)
        entry = {
            "metrics": cell_metrics(res.summary, res.requests),
            "requests": res.requests,
            "sim_time_s": 0.0,
        }
        entry["sim_time_s"] = float(res.summary["sim_time_s"])
        if info["other"] is not None and c.concurrency is not None:
            res_w = replay(tr, c.policy, profile=info["other"], **kw)
            entry["wall_metrics"] = cell_metrics(res_w.summary, res_w.requests)
        sims[c] = entry
    return sims, rates


def decompose(c: Cell, steps: pd.DataFrame, cost: Any, trace: Any) -> dict[str, Any]:
    """Mean ms per decode-only step, real against the cost model's terms at the same steps
    (same batch, requests and context): which term differs."""
    st = steps[(steps["prefilling"] == 0) & (steps["decoding"] > 0)]
    out: dict[str, Any] = {"drafter": c.drafter, "policy": c.policy, "load": c.load}
    if st.empty:
        return out
    n = st["decoding"].to_numpy(np.float64)
    ctx = st["ctx_mean"].to_numpy(np.float64)
    b = st["batch_tokens"].to_numpy(np.int64)
    gamma = int(trace.block_size)
    win = cost.draft_context_window or np.inf
    m_draft = cost.draft_ms(n, gamma) + cost.draft_per_context_us * 1e-3 * n * np.minimum(
        ctx - 1, win
    )
    m_table = np.array([cost.step_time(int(x), float(y)) for x, y in zip(b, ctx, strict=True)])
    m_table *= 1000.0
    m_over = cost.overhead_ms(n) + cost.accept_per_token_ms * b
    real_loop = st["duration_s"] - st["draft_s"] - st["sched_s"] - st["verify_s"]
    out.update(
        {
            "steps": len(st),
            "real_draft_ms": 1000 * st["draft_s"].mean(),
            "model_draft_ms": float(m_draft.mean()),
            "real_sched_ms": 1000 * st["sched_s"].mean(),
            "real_forward_ms": 1000 * st["verify_s"].mean(),
            "model_table_ms": float(m_table.mean()),
            "real_loop_ms": 1000 * float(real_loop.mean()),
            "model_overhead_ms": float(m_over.mean()),
            "real_step_ms": 1000 * st["duration_s"].mean(),
            "model_step_ms": float((m_draft + m_table + m_over).mean()),
        }
    )
    return out
