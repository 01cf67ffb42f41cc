"""How a profile's tables are read between their points: the step table as a dense per-token
lookup (linear, or the CUDA-graph staircase), and the (requests, ms) curves.

Kept apart from :mod:`~specsim.sim.cost.model` (the CostModel and its terms) because these are
the reading rules, shared by the model, the profile importers and their tests.
"""

from __future__ import annotations

import numpy as np

from specsim.errors import SpecsimError

INTERPOLATIONS = ("linear", "step")


def dense_lookup(
    batch_tokens: np.ndarray,
    step_ms: np.ndarray,
    interpolation: str = "linear",
    capture_max_tokens: int = 0,
) -> np.ndarray:
    """Step seconds at every integer B = 0..max(batch_tokens).

    ``linear``: linear between points. ``step``: a batch inside the CUDA-graph capture sizes
    (B <= ``capture_max_tokens``; 0: the whole table) pays the next profiled size >= B, the
    graph it is padded to, as vLLM's adaptive verification reads its startup profile; past the
    capture sizes (eager mode) the table is continuous: linear between the eager points, the
    first eager point held below it (an eager step is not a blend of a graph and eager one).
    """
    b = np.asarray(batch_tokens, dtype=np.float64)
    ms = np.asarray(step_ms, dtype=np.float64)
    grid = np.arange(int(b[-1]) + 1, dtype=np.float64)
    if interpolation == "linear":
        return np.interp(grid, b, ms) / 1000.0  # np.interp holds the end values outside
    cap = capture_max_tokens or int(b[-1])
    inside = b <= cap
    out = np.empty_like(grid)
    n_in = int(inside.sum())
    g_in = grid <= cap
    if n_in:
        idx = np.minimum(np.searchsorted(b[:n_in], grid[g_in], side="left"), n_in - 1)
        out[g_in] = ms[:n_in][idx]
    if n_in < b.size:
        out[~g_in] = np.interp(grid[~g_in], b[n_in:], ms[n_in:])
    elif np.any(~g_in):  # the capture limit is past the table: hold its last point
        out[~g_in] = ms[-1]
    return out / 1000.0


# A step table is looked up densely (one entry per token batch size): it may cover up to a
# million tokens a step; any cost term above an hour is a unit mistake.
MAX_PROFILE_BATCH = 1_000_000
MAX_COST = 3.6e9
# the float terms of a profile header (non-negative; ms or us as named)
COST_KEYS = (
    "draft_base_ms",
    "draft_per_request_ms",
    "draft_per_token_ms",
    "sched_base_us",
    "sched_us_per_request",
    "step_overhead_ms",
    "verify_per_request_ms",
    "draft_per_context_us",
    "prefill_token_ms",
    "accept_per_token_ms",
    "draft_prefill_us_per_token",
    "kv_read_us_per_ktoken",
    "attn_us_per_qk_ktoken",
    "emit_per_token_ms",
    "verify_draft_token_ms",
    "mixed_step_ms",
    "pass_extra_ms",
)
# the (requests, ms) curves a profile header may hold: the engine loop's overhead, a draft
# call's cost, and a sequential drafter's cost a drafted position (EAGLE, MTP)
CURVE_KEYS = ("overhead_curve", "draft_curve", "draft_step_curve")


def checked_curve(name: str, key: str, curve) -> tuple[tuple[int, float], ...]:  # type: ignore[no-untyped-def]
    """A curve of (requests, ms) points as a tuple, or a one-line error naming the fix."""
    out = tuple((int(r), float(m)) for r, m in curve)
    if out:
        rr = np.array([r for r, _ in out], dtype=np.float64)
        mm = np.array([m for _, m in out], dtype=np.float64)
        if rr[0] < 1 or np.any(np.diff(rr) <= 0):
            raise SpecsimError(
                f"profile {name!r}: {key} needs ascending request counts >= 1 "
                "(e.g. '1:0.5,4:12,16:60')"
            )
        if not np.all(np.isfinite(mm)) or np.any(mm < 0) or np.any(mm > MAX_COST):
            raise SpecsimError(
                f"profile {name!r}: {key} ms must be finite numbers in [0, {MAX_COST:g}]"
            )
    return out


def curve_at(curve: tuple[tuple[int, float], ...], n, step: bool = False):  # type: ignore[no-untyped-def]
    """A (requests, ms) curve at ``n`` requests: linear between points (``step``: the next
    point at or above ``n``, the captured size a batch is padded to), the first value held
    below the first point, the last segment's slope (never negative) beyond the last."""
    rr = np.array([r for r, _ in curve], dtype=np.float64)
    mm = np.array([m for _, m in curve], dtype=np.float64)
    if step:
        out = mm[np.minimum(np.searchsorted(rr, n, side="left"), rr.size - 1)]
    else:
        out = np.interp(n, rr, mm)
    if rr.size > 1:
        slope = max((mm[-1] - mm[-2]) / (rr[-1] - rr[-2]), 0.0)
        out = np.where(n > rr[-1], mm[-1] + slope * (n - rr[-1]), out)
    return out


__all__ = [
    "COST_KEYS", "CURVE_KEYS", "INTERPOLATIONS", "MAX_COST", "MAX_PROFILE_BATCH",
    "checked_curve", "curve_at", "dense_lookup",
]  # fmt: skip
