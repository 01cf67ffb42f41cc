"""``goodput``: one speculation length for the whole batch, as SmartSpec and vLLM choose it.

goodput(k) = R * (1 + sum_{i<=k} prod_{j<=i} alpha_j) / step_time(R * (1 + k)), with alpha the
ONLINE per-position conditional acceptance the engine estimates from what was verified so far
(``StepInput.accept_rate``). It ignores the per-token confidences, so it is non-anticipating.
"""

from __future__ import annotations

import numpy as np

from specsim.policies.base import POLICIES, Policy, StepInput

PRIOR_ACCEPT_RATE = 0.5  # used until the engine has estimates


def goodput_lengths(inp: StepInput) -> np.ndarray:
    r, gamma = inp.n_requests, inp.gamma
    if r == 0:
        return np.zeros(0, dtype=np.int64)
    rate = inp.accept_rate
    if rate is None:
        rate = np.full(gamma, PRIOR_ACCEPT_RATE)
    k = np.arange(gamma + 1)
    t = np.asarray(inp.step_time(r * (1 + k)), dtype=np.float64).tolist()
    # In Python floats (gamma + 1 values: numpy calls would cost more than the arithmetic),
    # the same IEEE operations in the same order as the array form
    #   survival = cumprod(clip(rate, 0, 1)); expected = r * (1 + [0, cumsum(survival)])
    #   argmax(expected / t)   (the first maximum; the first NaN if any, as np.argmax)
    best_i, best = 0, r * 1.0 / t[0]
    surv = cs = 0.0
    for i, a in enumerate(np.asarray(rate, dtype=np.float64)[:gamma].tolist()):
        a = 0.0 if a < 0.0 else 1.0 if a > 1.0 else a  # np.clip (NaN stays NaN)
        surv = a if i == 0 else surv * a
        cs = surv if i == 0 else cs + surv
        g = r * (1.0 + cs) / t[i + 1]
        if best == best and (g > best or g != g):
            best_i, best = i + 1, g
    return np.full(r, best_i, dtype=np.int64)


@POLICIES.register("goodput", help="one k for the batch from online acceptance (SmartSpec/vLLM)")
def goodput(arg: str | None = None) -> Policy:
    POLICIES.no_arg("goodput", arg)
    return Policy(
        name="goodput",
        schedule=goodput_lengths,
        needs=frozenset({"accept_rate"}),
        plan=goodput_plan,
    )


def goodput_plan(inp: StepInput) -> int:
    """The batch's k, known before drafting (it reads no confidence), with the drafting of k
    tokens priced in (``inp.draft_time``): draft k tokens, none when k is 0."""
    r, gamma = inp.n_requests, inp.gamma
    if r == 0:
        return 0
    if inp.draft_time is None:
        out = goodput_lengths(inp)
        return int(out[0])
    rate = inp.accept_rate if inp.accept_rate is not None else np.full(gamma, PRIOR_ACCEPT_RATE)
    surv = np.cumprod(np.clip(np.asarray(rate, dtype=np.float64)[:gamma], 0.0, 1.0))
    k = np.arange(gamma + 1)
    t = np.asarray(inp.step_time(r * (1 + k)), dtype=np.float64).copy()
    t[1:] += np.array([inp.draft_time(int(j)) for j in k[1:]])
    g = r * (1.0 + np.concatenate(([0.0], np.cumsum(surv)))) / t
    return int(np.argmax(g))
