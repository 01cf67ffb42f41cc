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


def _survival(conf: np.ndarray, given: np.ndarray | None = None) -> np.ndarray:
    """a_{r,j} = prod_{i<=j} c_{r,i}, flattened (r, j) row-major: the candidates' keys.

    ``given``: the engine's precomputed survivals of the same rows (equal bit for bit)."""
    if given is not None:
        return given.ravel()
    return np.cumprod(conf.astype(np.float64), axis=1).ravel()


def _ranked_values(survival: np.ndarray) -> np.ndarray:
    """The survivals in ranked order (descending; NaN last), without the order itself.

    Theta, its early stop and its argmax depend only on these values, never on which of two
    equal candidates comes first, so a plain (quick)sort of the values gives exactly what the
    stable argsort gave; which candidates are admitted then comes from ``_top_k_lengths``.
    """
    neg = -survival
    neg.sort()
    return np.negative(neg, out=neg)


def _step_times(step_time, start: int, n: int) -> np.ndarray:
    """step_time(start + arange(n)) as float64: a slice of the table when the engine gave one."""
    window = getattr(step_time, "window", None)
    t = window(start, n) if window is not None else None
    if t is None:
        t = np.asarray(step_time(start + np.arange(n)), dtype=np.float64)
    return t


def _stop_count(survival_sorted: np.ndarray, n_requests: int, step_time) -> int | None:
    """``early_stop_count(throughput_curve(...))`` over a ranked prefix; None: no stop in it.

    The same arithmetic as ``throughput_curve`` element by element (tau_0 = R + 0.0 = R,
    tau_i = R + cumsum_i), without building the concatenated curve.
    """
    m = survival_sorted.shape[0]
    t = _step_times(step_time, n_requests, m + 1)
    theta = (survival_sorted.cumsum() + n_requests) / t[1:]
    if m == 0:
        return None
    if theta[0] <= n_requests / t[0]:
        return 0
    worse = theta[1:] <= theta[:-1]
    first = int(worse.argmax()) if worse.shape[0] else 0
    return first + 1 if worse.shape[0] and worse[first] else None


# Stop count per request of recent early-stop searches (a slowly decaying maximum): where the
# next one starts looking. A speed hint only (a wrong one costs a second pass, never a different
# answer). A decaying maximum, not the last count: under chunked prefill the stop alternates
# between tiny (a step carrying a prompt chunk) and a step edge of the cost table, and a hint
# taken from a tiny one made 4 of 5 partial searches fail and sort again (issue #33).
_STOP_HINT = [1.0]
_HINT_DECAY = 0.98


def _early_stop_lengths(survival: np.ndarray, n_requests: int, gamma: int, step_time):
    """``hw-aware``'s lengths from flat survivals, without ranking the candidates.

    The early stop depends only on the ranked survival VALUES: when the last search stopped
    well inside the list, this one sorts just the values above a selected threshold (the top
    m, ties included: exactly the first m' values of the full ranking); if no stop lies in
    them, or the list is expected to be mostly admitted, it sorts all the values. The admitted
    set, the first ``count`` candidates of the stable ranking, is then counted per request by
    ``_top_k_lengths`` (a partition). Same lengths as ``ranked_candidates`` +
    ``early_stop_count``, bit for bit (tested against them).
    """
    n = survival.shape[0]
    m = int(_STOP_HINT[0] * n_requests * 1.5) + 16
    count = None
    if m < n // 2:
        v = np.partition(survival, n - m)[n - m]
        top = survival[survival >= v]  # NaN (never in a valid trace) is left out, as it ranks last
        ranked = _ranked_values(top)
        count = _stop_count(ranked, n_requests, step_time)
        if count is None and top.shape[0] == n:
            count = n
    if count is None:
        ranked = _ranked_values(survival)
        count = _stop_count(ranked, n_requests, step_time)
        if count is None:
            count = n
    _STOP_HINT[0] = max(count / n_requests, _STOP_HINT[0] * _HINT_DECAY)
    v = float(ranked[count - 1]) if 0 < count < n else None
    return _top_k_lengths(survival, count, n_requests, gamma, v)


def _global_budget_flat(survival: np.ndarray, n_requests: int, step_time) -> int:
    """``global_budget`` from flat survivals (sorted values, no second cumprod)."""
    surv_sorted = _ranked_values(survival)
    # throughput_curve's arithmetic, with the step times read as one slice when possible
    tau = n_requests + np.concatenate(([0.0], surv_sorted.cumsum()))
    theta = tau / _step_times(step_time, n_requests, tau.shape[0])
    return int(np.argmax(theta))


def _top_k_lengths(
    survival: np.ndarray, k: int, n_requests: int, gamma: int, v: float | None = None
) -> np.ndarray:
    """Per-request counts among the first k ranked candidates, without sorting.

    The first k of the stable order are every candidate above v (the k-th largest survival)
    and the lowest-index candidates equal to v; which of them come first does not change the
    counts. ``v``: that value when the caller already has it (from the sorted values).
    """
    n = survival.shape[0]
    if k <= 0:
        return np.zeros(n_requests, dtype=np.int64)
    if k >= n:
        return np.full(n_requests, gamma, dtype=np.int64)
    nan = np.isnan(survival).any() if v is None else v != v
    if nan:  # NaN (never in a valid trace; partition would rank it first): the plain ranking
        order = np.argsort(-survival, kind="stable")
        return lengths_from_admitted(order // gamma, k, n_requests)
    if v is None:
        v = np.partition(survival, n - k)[n - k]
    at_least = survival >= v
    if np.count_nonzero(at_least) == k:  # no tie at v beyond the k-th: the usual case
        return at_least.reshape(n_requests, gamma).sum(axis=1)
    above = survival > v
    need = k - np.count_nonzero(above)
    lengths = above.reshape(n_requests, gamma).sum(axis=1)
    if need:
        ties = (survival == v).nonzero()[0][:need]
        lengths += np.bincount(ties // gamma, minlength=n_requests)
    return lengths


def hw_aware_lengths(inp: StepInput) -> np.ndarray:
    """Algorithm 1 with early stop."""
    r, gamma = inp.conf.shape
    if r == 0:
        return np.zeros(0, dtype=np.int64)
    return _early_stop_lengths(_survival(inp.conf, inp.survival), r, gamma, inp.step_time)


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
    surv = _survival(inp.conf, inp.survival)
    budget = _global_budget_flat(surv, inp.n_requests, inp.step_time)
    return _top_k_lengths(surv, budget, inp.n_requests, inp.gamma)


def zos_lengths(inp: StepInput) -> np.ndarray:
    """Budget from lagged confidences (global search), then dynamic top-K on current ones."""
    if inp.n_requests == 0:
        return np.zeros(0, dtype=np.int64)
    surv = _survival(inp.conf, inp.survival)
    if inp.lagged_conf is None:
        lagged = surv
    else:
        lagged = _survival(inp.lagged_conf, inp.lagged_survival)
    budget = _global_budget_flat(lagged, inp.n_requests, inp.step_time)
    return _top_k_lengths(surv, budget, inp.n_requests, inp.gamma)


def plan_budget(survival: np.ndarray, n_requests: int, step_time, draft_time) -> int:
    """The global search of a budget K over ranked survivals, with drafting priced in: K = 0
    needs no draft (Theta = R / t(R)); any K > 0 pays ``draft_time`` on top of its step.
    The search ``zos`` and ``auto`` run before the drafter (``Policy.plan``)."""
    surv_sorted = _ranked_values(survival)
    tau = n_requests + np.concatenate(([0.0], surv_sorted.cumsum()))
    t = np.array(_step_times(step_time, n_requests, tau.shape[0]), dtype=np.float64)
    if draft_time is not None:
        t[1:] += float(draft_time)
    return int(np.argmax(tau / t))


def zos_plan(inp: StepInput) -> int | None:
    """Before drafting: the lagged budget, drafting priced in; 0 skips the drafter for the
    step, else the block (None). A request without a lagged row leaves it unknown: draft."""
    if inp.n_requests == 0:
        return 0
    if inp.lag_known is not None and not bool(np.all(inp.lag_known)):
        return None
    lagged = _survival(inp.conf, inp.survival)
    d = inp.draft_time(inp.gamma) if inp.draft_time is not None else None
    return 0 if plan_budget(lagged, inp.n_requests, inp.step_time, d) == 0 else None


# ---------------------------------------------------------------- one request, many rows
# With one request running, a decision is a function of one confidence row; the engine asks
# for the decisions of every row the request may visit at once (``Policy.solo``) and walks
# them without a SimPy event per step. With R = 1 the survivals of a row are non-increasing
# (confidences lie in [0, 1]), so the ranked order is j ascending and Theta is a row-wise
# cumulative sum: the same arithmetic, element by element, as the functions above.


def _solo_theta(conf: np.ndarray, step_time) -> np.ndarray:
    """(m, gamma + 1) Theta of each row as a lone request's candidate list."""
    surv = np.cumprod(conf.astype(np.float64), axis=1)
    if surv.shape[1] > 1 and not np.all(surv[:, 1:] <= surv[:, :-1]):
        raise ValueError("confidences outside [0, 1]: the solo form does not apply")
    tau = 1 + np.concatenate((np.zeros((surv.shape[0], 1)), np.cumsum(surv, axis=1)), axis=1)
    batch = 1 + np.arange(surv.shape[1] + 1)
    return tau / np.asarray(step_time(batch), dtype=np.float64)


def hw_aware_solo(conf: np.ndarray, accept_len: np.ndarray, step_time) -> np.ndarray:
    """``hw_aware_lengths`` of a lone request, for every row of ``conf`` at once."""
    theta = _solo_theta(conf, step_time)
    worse = theta[:, 1:] <= theta[:, :-1]
    return np.where(worse.any(axis=1), worse.argmax(axis=1), conf.shape[1]).astype(np.int64)


def global_solo(conf: np.ndarray, accept_len: np.ndarray, step_time) -> np.ndarray:
    """``global_budget`` of a lone request per row (``zos`` reads its lagged row with it)."""
    return _solo_theta(conf, step_time).argmax(axis=1).astype(np.int64)


@POLICIES.register("hw-aware", help="DSpark Algorithm 1: survival-ranked search, early stop")
def hw_aware(arg: str | None = None) -> Policy:
    POLICIES.no_arg("hw-aware", arg)
    return Policy(
        name="hw-aware",
        schedule=hw_aware_lengths,
        needs=frozenset({"survival"}),
        solo=hw_aware_solo,
        solo_rows=True,
    )


@POLICIES.register(
    "hw-aware-global", help="Algorithm 1 without early stop: NOT lossless (Appendix A)"
)
def hw_aware_global(arg: str | None = None) -> Policy:
    POLICIES.no_arg("hw-aware-global", arg)
    return Policy(
        name="hw-aware-global",
        schedule=hw_aware_global_lengths,
        lossless=False,
        needs=frozenset({"survival"}),
        solo=global_solo,
        solo_rows=True,
    )


@POLICIES.register("zos", help="production DSpark: lagged global budget + dynamic top-K, ZOS")
def zos(arg: str | None = None) -> Policy:
    POLICIES.no_arg("zos", arg)
    return Policy(
        name="zos",
        schedule=zos_lengths,
        zos=True,
        needs=frozenset({"lagged_conf", "survival", "lagged_survival"}),
        plan=zos_plan,
        solo=global_solo,
        solo_lagged=True,
    )
