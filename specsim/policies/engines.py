"""The serving engines' own DSpark verification rules, as built-in policies.

An operator deploys their engine's rule, not specsim's; predicting what their engine does under
load needs that rule exactly. Each function here is read from the engine's source (file and
commit in its docstring) and tested against steps worked by hand (tests/test_policies_engines.py).

``vllm-adaptive``: vLLM's adaptive verification (``enable_adaptive_verification``, PR #47808;
vllm-project/vllm@057929c3632766486896597cf27e1425fd838e63,
vllm/v1/worker/gpu/spec_decode/adaptive_verification.py, ``AdaptiveVerificationManager.
get_num_tokens`` and ``_assign_draft_token_budget``):

1. Budget, on the CPU from confidences two decode steps old (a double-buffered copy): the
   survivals ``cumprod(conf)`` of every scheduled draft, sorted descending (``s``); a request
   with no confidences yet is seeded with 1.0 at every position (optimistic). Then
   ``B* = argmax_B (N_sampling + sum_{i<B} s_i) / (draft_cost[num_reqs] + verify_cost[T + B])``,
   the first maximum (``np.argmax``: ties go to the smaller budget); no minimum-gain guard.
   ``T`` counts every scheduled non-draft token (one per decoding request, and prompt chunks):
   here the step time the engine gives a policy is already the table at ``T + B``.
2. Allocation, on the GPU from the live confidences: the global top-B of (request, position)
   survivals; survival falls along a request, so the winners are a prefix of each.

Lossless for the same reason as ``zos``: the budget reads only lagged rows and the allocation's
rank of (r, j) depends only on candidates ranked before it. What specsim leaves out: vLLM's
``N_sampling`` also counts prefilling requests whose last chunk is in this step, and its
``num_reqs`` counts them in the draft cost; the simulator's policies see decoding requests only.
vLLM drafts the whole block every step (it never skips the drafter), so the policy has no plan.
"""

from __future__ import annotations

import numpy as np

from specsim.errors import SpecsimError
from specsim.policies.base import POLICIES, Policy, StepInput
from specsim.policies.hw_aware import _ranked_values, _step_times, _survival, _top_k_lengths
from specsim.policies.threshold import leading_true


def budget_search(survival: np.ndarray, n_requests: int, step_time, draft_s: float = 0.0) -> int:
    """``argmax_B (n_requests + sum of the B best survivals) / (draft_s + step_time(R + B))``
    over B = 0..len(survival): the first maximum (the smallest best budget)."""
    ranked = _ranked_values(np.asarray(survival, dtype=np.float64).ravel())
    tau = n_requests + np.concatenate(([0.0], ranked.cumsum()))
    t = _step_times(step_time, n_requests, tau.shape[0]) + float(draft_s)
    return int(np.argmax(tau / t))


def vllm_lagged_survival(inp: StepInput) -> np.ndarray:
    """The survivals vLLM's budget reads: the lagged rows, 1.0 where a request has none yet."""
    lag = inp.lagged_conf if inp.lagged_conf is not None else inp.conf
    surv = _survival(lag, inp.lagged_survival if inp.lagged_conf is not None else inp.survival)
    if inp.lag_known is not None and not bool(np.all(inp.lag_known)):
        surv = surv.reshape(inp.n_requests, inp.gamma).copy()
        surv[~np.asarray(inp.lag_known, dtype=bool)] = 1.0
        surv = surv.ravel()
    return surv


def vllm_adaptive_lengths(inp: StepInput) -> np.ndarray:
    """vLLM's budget (lagged survivals, drafting in the denominator), then the live top-B."""
    r = inp.n_requests
    if r == 0:
        return np.zeros(0, dtype=np.int64)
    draft_s = inp.draft_time(inp.gamma) if inp.draft_time is not None else 0.0
    budget = budget_search(vllm_lagged_survival(inp), r, inp.step_time, draft_s)
    return _top_k_lengths(_survival(inp.conf, inp.survival), budget, r, inp.gamma)


@POLICIES.register(
    "vllm-adaptive", help="vLLM's adaptive verification (PR #47808): lagged budget, drafting priced"
)
def vllm_adaptive(arg: str | None = None) -> Policy:
    if arg is not None:
        raise SpecsimError(f"policy 'vllm-adaptive' takes no argument (got vllm-adaptive:{arg})")
    return Policy(
        name="vllm-adaptive",
        schedule=vllm_adaptive_lengths,
        zos=True,  # the budget is computed ahead, overlapped with the previous step
        needs=frozenset({"lagged_conf", "survival", "lagged_survival", "lag_known", "draft_time"}),
        doc=__doc__ or "",
    )


def llama_dspark_lengths(conf: np.ndarray, p_min: float, n_max: int | None = None) -> np.ndarray:
    """llama.cpp's draft-dspark cut, per request: the drafts before the first position whose
    confidence is below ``p_min`` (none below: all of them), capped at ``n_max``.

    llama.cpp build 11434, ``common/speculative.cpp``, ``draft()`` (the ``is_dspark`` branch):
    the block is cut before the first position whose confidence-head sigmoid is ``< p_min``
    (``--spec-draft-p-min``, default 0: the whole block); ``n_max`` is ``--spec-draft-n-max``.
    A cut to 0 drafts means no speculation that step (one token)."""
    keep = leading_true(np.asarray(conf) >= p_min)
    return np.minimum(keep, n_max) if n_max is not None else keep


@POLICIES.register(
    "llama-dspark",
    help="llama-dspark[:P[:N]]: llama.cpp's draft-dspark, cut at the first confidence < P "
    "(--spec-draft-p-min, default 0), at most N drafts (--spec-draft-n-max)",
)
def llama_dspark(arg: str | None = None) -> Policy:
    """llama.cpp's ``--spec-type draft-dspark`` rule (see :func:`llama_dspark_lengths`).

    Row-wise and non-anticipating (position k's admission reads c_1..c_k only), so lossless.
    llama.cpp compares the RAW confidence head; specsim's recorded traces store STS-calibrated
    confidences (trace metadata ``confidence: sts``), and calibration moves every confidence
    by its position's temperature: with a trace whose temperatures are far from 1 the cut lands
    elsewhere than llama.cpp's. reports/llama-cpp-dspark measures the server's cut on raw
    confidences directly. Serve with ``--spec-draft-n-max`` equal to the drafter's block size
    (attention in the block is non-causal; docs/llama-cpp-dspark.md), so N is a cap for studies.
    """
    parts = [] if arg is None else arg.split(":")
    try:
        p_min = float(parts[0]) if parts else 0.0
        n_max = int(parts[1]) if len(parts) > 1 else None
    except ValueError:
        raise SpecsimError(
            f"llama-dspark:{arg}: use llama-dspark:P or llama-dspark:P:N (P in [0, 1], N >= 0)"
        ) from None
    if len(parts) > 2 or not 0.0 <= p_min <= 1.0 or (n_max is not None and n_max < 0):
        raise SpecsimError(
            f"llama-dspark:{arg}: use llama-dspark:P or llama-dspark:P:N (P in [0, 1], N >= 0)"
        )

    def schedule(inp: StepInput) -> np.ndarray:
        return llama_dspark_lengths(inp.conf, p_min, n_max)

    def solo(conf: np.ndarray, accept_len: np.ndarray, step_time) -> np.ndarray:  # noqa: ANN001
        return llama_dspark_lengths(conf, p_min, n_max)

    name = f"llama-dspark:{p_min:g}" + (f":{n_max}" if n_max is not None else "")
    return Policy(
        name=name, schedule=schedule, solo=solo, rowwise=True, solo_rows=True,
        doc=llama_dspark.__doc__ or "",
    )  # fmt: skip


__all__ = [
    "budget_search",
    "llama_dspark",
    "llama_dspark_lengths",
    "vllm_adaptive",
    "vllm_adaptive_lengths",
    "vllm_lagged_survival",
]
