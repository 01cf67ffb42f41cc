"""Public building blocks for plug-in policies: the pieces every engine rule is made of.

A plug-in that reproduces an engine's scheduler (vLLM's adaptive verification, TensorRT-LLM's
confidence scheduling, SGLang's ragged verify) needs the same four things the built-ins use:

- :func:`survival`: a_{r,k} = c_{r,1} * ... * c_{r,k}, the probability that draft k of request r
  is reached and accepted when the confidences are calibrated. Every rule ranks by it.
- :func:`top_k_lengths`: the global top-B allocation. The B candidates (r, k) with the highest
  survival are verified; survival falls along a request, so the winners are a prefix of each
  request and the answer is one length per request. Ties are broken by (request, position)
  (specsim's and vLLM's order) or by (position, request) (TensorRT-LLM's).
- :func:`budget_search`: the budget B* = argmax_B (N + sum of the B best survivals) /
  (draft_s + step_time(N + B)), the first maximum; :func:`throughput_by_budget` is the curve it
  maximises, for rules that change its constant terms or add a guard.
- :func:`lagged_survival`: the survivals the engine knew when the budget had to be fixed (two
  steps earlier: the engine fills ``StepInput.lagged_conf``), with the rows of requests too new
  to have one replaced by an optimistic 1.0 (vLLM, SGLang and TensorRT-LLM all do) or kept.
  :func:`draft_seconds` is what drafting costs this step, for rules that price it.

One implementation per rule: ``survival``, ``ranked_values``, ``step_times`` and
``top_k_lengths`` are the helpers ``hw-aware`` and ``zos`` run (:mod:`specsim.policies.hw_aware`,
re-exported here with their contracts); ``budget_search`` is ``vllm-adaptive``'s search, and
without drafting it is ``zos``'s global search to the bit (tested). ``vllm-adaptive`` and
``trtllm-confidence`` are built from these blocks alone, so a plug-in built from them decides
exactly what the built-in decides. docs/policies.md reproduces ``vllm-adaptive`` in about 20
lines from them; ``tests/test_policies_blocks.py`` checks it.

Why lossless: a budget computed from lagged rows sees nothing of the current drafts, and the
rank of (r, k) in the top-B depends only on candidates ranked before it (higher survival, or
equal and earlier in the tie order), none of which depends on the draft token x_{r,k}.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import numpy as np

from specsim.policies.base import StepInput, StepTime
from specsim.policies.hw_aware import _ranked_values, _step_times, _survival, _top_k_lengths

Ties = Literal["request", "position"]


def survival(conf: np.ndarray, given: np.ndarray | None = None) -> np.ndarray:
    """Flat (R * gamma,) survivals a_{r,k} = prod_{i<=k} c_{r,i}, row-major (r, k), float64.

    ``given``: the engine's precomputed survivals of the same rows (``StepInput.survival``,
    equal bit for bit): pass it and nothing is recomputed. ``survival(inp.conf, inp.survival)``
    is the idiom."""
    return _survival(conf, given)


def ranked_values(survival: np.ndarray) -> np.ndarray:
    """The survivals sorted descending (NaN last), without the order itself: a budget search
    depends only on these values, never on which of two equal candidates comes first."""
    return _ranked_values(np.asarray(survival, dtype=np.float64).ravel())  # a new array


def step_times(step_time: StepTime, start: int, n: int) -> np.ndarray:
    """Seconds of the target steps over token batches ``start .. start + n - 1``, float64 (a
    slice of the engine's table when it gave one: no batch array is built)."""
    return _step_times(step_time, start, n)


def throughput_by_budget(
    survival_sorted: np.ndarray,
    step_time: StepTime,
    *,
    base: float,
    start: int,
    draft_s: float = 0.0,
) -> np.ndarray:
    """Theta(B) = (base + sum of the first B values) / (draft_s + step_time(start + B)) for
    B = 0..len(survival_sorted): expected tokens per second if the B best candidates are verified.

    ``base``: the expected tokens every request yields anyway (one bonus token per request, N;
    TensorRT-LLM adds the survivals of the positions it always verifies). ``start``: the token
    batch at B = 0 (N, or more when positions are verified unconditionally). ``draft_s``: seconds
    of drafting paid by every B (vLLM prices it; 0: the step alone)."""
    tau = base + np.concatenate(([0.0], np.cumsum(survival_sorted)))
    t = step_times(step_time, start, tau.shape[0])
    return tau / (t + float(draft_s)) if draft_s else tau / t


def budget_search(
    survival: np.ndarray, n_requests: int, step_time: StepTime, draft_s: float = 0.0
) -> int:
    """``argmax_B (n_requests + sum of the B best survivals) / (draft_s + step_time(R + B))`` over
    B = 0..len(survival): the first maximum (ties go to the smaller budget, as ``np.argmax``).

    The global search (no early stop): it sees the whole step-time curve, so a cliff does not trap
    it. Lossless only when ``survival`` holds rows the current drafts cannot influence (lagged
    ones, :func:`lagged_survival`); ``hw-aware-global`` runs it on the current rows and is not."""
    ranked = ranked_values(survival)
    theta = throughput_by_budget(
        ranked, step_time, base=float(n_requests), start=n_requests, draft_s=draft_s
    )
    return int(np.argmax(theta))


def top_k_lengths(
    survival: np.ndarray, k: int, n_requests: int, gamma: int, ties: Ties = "request"
) -> np.ndarray:
    """(R,) int64 counts of each request's candidates among the k with the highest survival.

    Survivals fall along a request (confidences lie in [0, 1]), and both tie orders put (r, j)
    before (r, j + 1), so each request's winners are its first ``lengths[r]`` positions: the
    allocation is prefix-closed. ``ties="request"``: equal survivals go to the lower (request,
    position) first (specsim's ranking, vLLM's); ``"position"``: to the lower (position, request)
    first (TensorRT-LLM's ``schedule_verify_lens_topk``). Counts only; no sort of all candidates."""
    flat = np.asarray(survival, dtype=np.float64).ravel()
    if ties == "request":
        return _top_k_lengths(flat, k, n_requests, gamma)
    return _top_k_position_major(flat.reshape(n_requests, gamma), k)


def _top_k_position_major(surv: np.ndarray, k: int) -> np.ndarray:
    """``top_k_lengths`` with ties at the k-th value taken in (position, request) order."""
    n_requests, gamma = surv.shape
    n = surv.size
    if k <= 0:
        return np.zeros(n_requests, dtype=np.int64)
    if k >= n:
        return np.full(n_requests, gamma, dtype=np.int64)
    v = np.partition(surv.ravel(), n - k)[n - k]
    above = surv > v
    lengths = above.sum(axis=1).astype(np.int64)
    need = k - int(lengths.sum())
    if need > 0:
        tie_req = np.nonzero((surv == v).T)[1][:need]  # .T: position-major order
        lengths += np.bincount(tie_req, minlength=n_requests)
    return lengths


def lagged_survival(inp: StepInput, unknown: float | None = 1.0) -> np.ndarray:
    """Flat survivals of the rows the engine knew when the budget had to be fixed
    (``inp.lagged_conf``, two steps old; ``inp.conf`` when the caller gave none).

    ``unknown``: the survival given to every position of a request with no lagged row yet
    (``inp.lag_known`` False; the engine put its current row there): 1.0, "certainly accepted",
    is what vLLM (``AdaptiveVerificationManager``), SGLang (``_two_steps_prior_survival``) and
    TensorRT-LLM (``NEUTRAL_CONFIDENCE_LOGIT``) do; None keeps the row the engine put there.
    A policy reading it should list ``lagged_conf``, ``lagged_survival`` and ``lag_known`` in
    ``Policy.needs``."""
    if inp.lagged_conf is not None:
        surv = survival(inp.lagged_conf, inp.lagged_survival)
    else:
        surv = survival(inp.conf, inp.survival)
    known = inp.lag_known
    if unknown is None or known is None or bool(np.all(known)):
        return surv
    out = surv.reshape(inp.n_requests, inp.gamma).copy()
    out[~np.asarray(known, dtype=bool)] = float(unknown)
    return out.ravel()


def draft_seconds(inp: StepInput, k: int | None = None) -> float:
    """Seconds drafting ``k`` tokens (default: the block) for every request costs this step, 0.0
    when the engine charges no drafting. Listed in ``Policy.needs`` as ``draft_time``."""
    fn: Callable[[int], float] | None = inp.draft_time
    if fn is None:
        return 0.0
    return float(fn(inp.gamma if k is None else k))


__all__ = [
    "budget_search",
    "draft_seconds",
    "lagged_survival",
    "ranked_values",
    "step_times",
    "survival",
    "throughput_by_budget",
    "top_k_lengths",
]
