"""Held-out evaluation of a drafter: tau per category, per-position acceptance, calibration.

Builds an in-memory trace (the same rows ``specsim record`` writes) from teacher-forced held-out
sequences and reads every number off ``specsim.trace.stats``, so the figures a training run
reports are computed exactly like those of a shipped trace.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specsim.record.recorder import greedy_rows
from specsim.trace.model import Trace


def rows_trace(drafter: Any, seqs: list[Any], raw: bool = True) -> Trace:
    """A greedy in-memory trace of ``seqs`` (raw or STS confidences)."""
    rows = [greedy_rows(drafter, s, raw=raw) for s in seqs]
    lens = np.array([r.accept_len.shape[0] for r in rows], dtype=np.int32)
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    return Trace(
        request_ids=np.arange(len(rows), dtype=np.int64),
        prompt_len=np.array([s.prompt_len for s in seqs], dtype=np.int32),
        output_len=lens,
        offsets=offsets,
        conf=np.concatenate([r.confidence for r in rows]),
        accept_len=np.concatenate([r.accept_len for r in rows]),
        draft_tokens=np.concatenate([r.draft_tokens for r in rows]),
        category=np.array([s.category for s in seqs], dtype=object),
        meta={"block_size": str(drafter.cfg.block_size)},
    )


def summary(trace: Trace) -> dict[str, Any]:
    """tau and calibration of a trace, overall and per category (plain floats)."""
    from specsim.trace.stats import trace_stats

    st = trace_stats(trace)
    keys = (
        "tau_replay",
        "tau_rows",
        "accept_rate",
        "conf_auroc",
        "conf_ece",
        "survival_auroc",
        "survival_ece",
    )

    def pick(d: dict) -> dict:
        out = {}
        for k in keys:
            v = d.get(k)
            out[k] = (
                [round(float(x), 4) for x in v]
                if isinstance(v, (list, np.ndarray))
                else (None if v is None else round(float(v), 4))
            )
        return out

    res = {"all": pick(st)}
    for cat, d in (st.get("categories") or {}).items():
        res[cat] = pick(d)
    return res
