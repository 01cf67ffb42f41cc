"""DSpark's hardware-aware prefix scheduler (the paper's Algorithm 1) and its production forms.

The search, for R requests with conditional confidences c_{r,1..gamma}:

1. a_{r,j} = prod_{i<=j} c_{r,i}; candidates (r, j) sorted by a descending. Ties are broken by
   (r, j) ascending, so (r, j) always precedes (r, j+1): the order respects prefixes.
2. Start with l_r = 0, B = R tokens (every request verifies its bonus token), expected tokens
   tau = R, Theta = R * SPS(R).
3. Admit candidates in order: B += 1, tau += a_{r,j}, Theta = tau * SPS(B).

``hw-aware`` stops at the first admission that does not improve Theta (early stop). Whether
(r, j) is admitted then depends only on candidates ranked before it, none of which depends on the
draft token x_{r,j} (a_{r,j+1} does, through the Markov feature, but ranks after): lossless.

``hw-aware-global`` takes the best Theta over the WHOLE sorted list. That looks past a
non-improving step, so a_{r,j+1} (a function of x_{r,j}) decides whether x_{r,j} is verified:
NOT lossless (the paper's Appendix A: (0.85, 0.15) instead of (0.7, 0.3)). Kept to show why.

``zos`` (section 5.2): the verification budget K (total draft tokens this step) is found by the
global search over confidences known two steps earlier (``lagged_conf``): it must be fixed
before the previous step ends, and a global search does not get trapped by a jagged SPS curve.
Then the K candidates with the highest CURRENT survivals are verified (dynamic top-K). The
budget sees nothing of the current drafts and the top-K rank of (r, j) depends only on
candidates ranked before it: lossless.
"""

from __future__ import annotations

import numpy as np

from specsim.errors import SpecsimError
from specsim.policies.base import POLICIES, Policy, StepInput


def ranked_candidates(conf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Candidates (r, j) by survival descending, prefix-respecting ties.

    Returns (request index, survival) of each candidate in admission order, both (R*gamma,).
    """
    survival = np.cumprod(conf.astype(np.float64), axis=1).ravel()
    order = np.argsort(-survival, kind="stable")  # stable: ties keep (r, j) ascending
    gamma = conf.shape[1]
    return order // gamma, survival[order]


def throughput_curve(survival_sorted: np.ndarray, n_requests: int, step_time) -> np.ndarray:
    """Theta_i = expected tokens per second after admitting the first i candidates, i = 0..n."""
    tau = n_requests + np.concatenate(([0.0], np.cumsum(survival_sorted)))
    batch = n_requests + np.arange(tau.shape[0])
    return tau / np.asarray(step_time(batch), dtype=np.float64)


def early_stop_count(theta: np.ndarray) -> int:
    """Admissions made before the first one that does not improve Theta."""
    worse = np.flatnonzero(theta[1:] <= theta[:-1])
    return int(worse[0]) if worse.size else theta.shape[0] - 1


def lengths_from_admitted(req: np.ndarray, n_admitted: int, n_requests: int) -> np.ndarray:
    """Per-request verified lengths from the first ``n_admitted`` ranked candidates."""
    return np.bincount(req[:n_admitted], minlength=n_requests).astype(np.int64)


def hw_aware_lengths(inp: StepInput) -> np.ndarray:
    """Algorithm 1 with early stop."""
    if inp.n_requests == 0:
        return np.zeros(0, dtype=np.int64)
    req, surv = ranked_candidates(inp.conf)
    theta = throughput_curve(surv, inp.n_requests, inp.step_time)
    return lengths_from_admitted(req, early_stop_count(theta), inp.n_requests)


def global_budget(conf: np.ndarray, step_time) -> int:
    """The number of draft tokens that maximises Theta over the whole sorted list."""
    if conf.shape[0] == 0:
        return 0
    _, surv = ranked_candidates(conf)
    theta = throughput_curve(surv, conf.shape[0], step_time)
    return int(np.argmax(theta))  # first maximum: the smallest best budget


def hw_aware_global_lengths(inp: StepInput) -> np.ndarray:
    """The same search without early stop: anticipating, NOT lossless."""
    if inp.n_requests == 0:
        return np.zeros(0, dtype=np.int64)
    req, _ = ranked_candidates(inp.conf)
    return lengths_from_admitted(req, global_budget(inp.conf, inp.step_time), inp.n_requests)


def zos_lengths(inp: StepInput) -> np.ndarray:
    """Budget from lagged confidences (global search), then dynamic top-K on current ones."""
    if inp.n_requests == 0:
        return np.zeros(0, dtype=np.int64)
    lagged = inp.conf if inp.lagged_conf is None else inp.lagged_conf
    budget = global_budget(lagged, inp.step_time)
    req, _ = ranked_candidates(inp.conf)
    return lengths_from_admitted(req, budget, inp.n_requests)


def _no_arg(name: str, arg: str | None) -> None:
    if arg is not None:
        raise SpecsimError(f"policy {name!r} takes no argument (got {name}:{arg})")


@POLICIES.register("hw-aware", help="DSpark Algorithm 1: survival-ranked search, early stop")
def hw_aware(arg: str | None = None) -> Policy:
    _no_arg("hw-aware", arg)
    return Policy(name="hw-aware", schedule=hw_aware_lengths)


@POLICIES.register(
    "hw-aware-global", help="Algorithm 1 without early stop: NOT lossless (Appendix A)"
)
def hw_aware_global(arg: str | None = None) -> Policy:
    _no_arg("hw-aware-global", arg)
    return Policy(name="hw-aware-global", schedule=hw_aware_global_lengths, lossless=False)


@POLICIES.register("zos", help="production DSpark: lagged global budget + dynamic top-K, ZOS")
def zos(arg: str | None = None) -> Policy:
    _no_arg("zos", arg)
    return Policy(name="zos", schedule=zos_lengths, zos=True, needs=frozenset({"lagged_conf"}))
