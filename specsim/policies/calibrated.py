"""``calibrated-zos`` (alias ``auto``): DSpark's ZOS scheduler on confidences re-calibrated
online from what the verifier has been accepting, with a look-ahead stop for a lone request.

Why: ``zos`` trusts the drafter's confidences: an over-confident drafter (the recorded chat
trace) makes its global budget buy verification of tokens that are then rejected, and it loses
to plain ``mtp1``. ``hw-aware`` is trapped by its early stop at SPS bucket cliffs from a few
requests on. The best static length changes with trace and load. This policy:

1. Calibrates. Each conditional confidence c_{r,k} becomes the acceptance rate observed in
   EARLIER steps for position-k drafts of the same request class (the trace's category) whose
   confidence fell in the same bin (``StepInput.accept_hist``), shrunk towards the position's
   pooled rate and, with no data, towards c itself; linear between bin centres. c'_{r,k} reads
   c_{r,k} and the past only. Survivals a'_{r,j} = prod_{i<=j} c'_{r,i}.
2. One request in flight: an early stop that looks ahead. Draft k is admitted while the best
   EXPECTED continuation (a'_k times the history's acceptance rates beyond k, over the whole
   step-time curve) beats stopping before it: Algorithm 1's stop without its cliff trap.
3. Several: ZOS. A budget of K tokens from the global search (the whole SPS curve, no early
   stop) over the calibrated survivals of the LAGGED rows; then the K current candidates of
   highest calibrated survival are verified. Up to ``SMALL_BATCH`` requests one lagged row a
   request is a noisy sample, so the search runs on the mean of that sample's top-K gain curve
   and the history's uniform one (``blended_budget``).

Lossless: whether draft k of request r is verified depends on c_{r,1..k} (its calibrated
survival; its rank, which only candidates ranked before it decide; the look-ahead's known
prefix), on other requests, on lagged rows and on outcomes of earlier steps; never on
c_{r,k+1..}. Every admitted set is prefix-closed (survivals do not grow along a row; ties rank
(r, j) ascending). The losslessness suite checks it, and catches a mutant that calibrates on
the CURRENT step's outcomes.
"""

from __future__ import annotations

import numpy as np

from specsim.policies.base import POLICIES, Policy, StepInput
from specsim.policies.hw_aware import (
    _global_budget_flat,
    _step_times,
    _top_k_lengths,
    plan_budget,
)

try:  # np.clip's own ufunc, without its Python wrappers (same numbers; ~4 us a call less)
    from numpy._core.umath import clip as _clip
except ImportError:  # pragma: no cover - another numpy layout
    _clip = np.clip

POOL_WEIGHT = 8.0  # pseudo-observations of the raw confidence behind a position's pooled rate
CLASS_WEIGHT = 16.0  # pseudo-observations of the pooled rate behind a class's own rate
SMALL_BATCH = 4  # up to this many requests the budget also reads the history's expectation


_PRIOR: dict[int, np.ndarray] = {}  # bins -> POOL_WEIGHT * bin centres (a step computes it)


def calibration_table(hist: np.ndarray) -> np.ndarray:
    """(C, gamma, bins) acceptance estimate per class, position and confidence bin."""
    bins = hist.shape[2]
    prior = _PRIOR.get(bins)
    if prior is None:
        prior = _PRIOR.setdefault(bins, POOL_WEIGHT * ((np.arange(bins) + 0.5) / bins))
    pooled = np.add.reduce(hist, axis=0)  # hist.sum(axis=0) without its Python wrappers
    p_pool = (pooled[..., 1] + prior) / (pooled[..., 0] + POOL_WEIGHT)
    return (hist[..., 1] + CLASS_WEIGHT * p_pool) / (hist[..., 0] + CLASS_WEIGHT)


def calibrate(conf: np.ndarray, table: np.ndarray, cls: np.ndarray | None) -> np.ndarray:
    """c' of every (r, k): the table read at c, linear between bin centres, clipped to [0, 1]."""
    r, gamma = conf.shape
    bins = table.shape[2]
    x = _clip(conf.astype(np.float64), 0.0, 1.0) * bins - 0.5
    i0 = _clip(np.floor(x).astype(np.int64), 0, bins - 1)
    i1 = np.minimum(i0 + 1, bins - 1)
    f = _clip(x - i0, 0.0, 1.0)
    # the table at (class, position, bin) for both neighbouring bins: one flat take each
    at = np.arange(gamma) * bins  # (class * gamma + k) * bins, the row of each (r, k)
    if cls is not None:
        at = at + np.asarray(cls, np.int64)[:, None] * (gamma * bins)
    flat = table.reshape(-1)
    v0 = flat.take(at + i0)
    v1 = flat.take(at + i1)
    return _clip(v0 + (v1 - v0) * f, 0.0, 1.0)


def _calibrated_survival(conf: np.ndarray, inp: StepInput, table) -> np.ndarray:
    c = conf if table is None else calibrate(conf, table, inp.request_class)
    return np.cumprod(c.astype(np.float64), axis=1).ravel()


def history_rates(hist: np.ndarray | None, gamma: int) -> np.ndarray:
    """Conditional acceptance per position over every class and bin (a prior of one accept
    and one reject): what the drafts beyond the ones seen are expected to do."""
    if hist is None:
        return np.full(gamma, 0.5)
    h = hist.sum(axis=(0, 2))
    return (h[:, 1] + 1.0) / (h[:, 0] + 2.0)


def lone_length(surv: np.ndarray, rate: np.ndarray, step_time) -> int:
    """One request: admit draft k while the best EXPECTED continuation from k (its known
    survival, times the history's acceptance rates beyond it) beats stopping before k.

    An early stop, like Algorithm 1's, but one that looks past a cliff of the step-time curve
    with what the history says comes next. The decision on draft k reads a'_1..a'_k and the
    past only."""
    gamma = surv.shape[0]
    window = getattr(step_time, "window", None)  # TableStepTime: the same numbers as a slice
    t = window(1, gamma + 1) if window is not None else None
    if t is None:
        t = step_time(1 + np.arange(gamma + 1))
    t = np.asarray(t, dtype=np.float64).tolist()
    # In Python floats (a few dozen operations: numpy calls would cost ~20x more), the same
    # IEEE operations in the same order as the array form: for each k, with
    # proj = a'_k * [1, cumprod(rate[k+1:])], stop at k if
    # max((tok + cumsum(proj)) / t[k+1:]) <= tok / t[k]; a NaN makes the max NaN, as np.max.
    s = surv.tolist()
    rt = rate.tolist()
    tok = 1.0
    for k in range(gamma):
        sk = s[k]
        p = 1.0
        cs = sk * p
        best = (tok + cs) / t[k + 1]
        for j in range(k + 1, gamma):
            p = p * rt[j]
            cs = cs + sk * p
            v = (tok + cs) / t[j + 1]
            if v > best or v != v:
                best = v if best == best else best
        if best <= tok / t[k]:
            return k
        tok += sk
    return gamma


def blended_budget(
    lag_surv: np.ndarray, rate: np.ndarray, r: int, step_time, draft_time: float | None = None
) -> int:
    """Tokens for a small batch: the global search over the MEAN of two estimates of the
    current batch's top-K gain curve (expected accepted drafts when the K highest survivals
    are verified):

    - the lagged rows' own curve: the right shape (it knows that a few drafts are far likelier
      than the rest), but a sample of r rows, noisy when r is small;
    - the history's uniform curve: every request's k-th draft survives with prod rate_1..k,
      the K-th token going to the next request's next position: steady, but blind to how
      unequal the confidences are, so it over-rates a large budget when they are informative.

    Why the mean and not the larger budget of the two (the floor this replaced): the floor
    kept the uniform budget whenever the sample asked for less, and on the recorded code trace
    with the CPU profile at 4 in flight it verified as much as ``static:3`` (0.970 of
    ``hw-aware``, reports/schedulers-under-load). The decision reads lagged rows and earlier
    outcomes only, as the global search does.
    """
    m = lag_surv.shape[0]
    sample = -np.sort(-lag_surv)
    uniform = np.repeat(np.cumprod(np.asarray(rate, dtype=np.float64)), r)[:m]
    tau = r + np.concatenate(([0.0], 0.5 * (np.cumsum(sample) + np.cumsum(uniform))))
    t = _step_times(step_time, r, m + 1)
    if draft_time is not None:  # before drafting (the plan): K > 0 pays for the drafter
        t = np.array(t, dtype=np.float64)
        t[1:] += float(draft_time)
    return int(np.argmax(tau / t))


def calibrated_zos_lengths(inp: StepInput) -> np.ndarray:
    """See the module docstring: calibrate, budget from lagged rows, verify the current top K
    (among the drafts there are: the first ``inp.drafted`` of each block when the plan drafted
    fewer than the block)."""
    r, gamma = inp.n_requests, inp.gamma
    if r == 0:
        return np.zeros(0, dtype=np.int64)
    table = None if inp.accept_hist is None else calibration_table(inp.accept_hist)
    surv = _calibrated_survival(inp.conf, inp, table)
    rate = history_rates(inp.accept_hist, gamma)
    if r == 1:
        return np.array([lone_length(surv, rate, inp.step_time)], dtype=np.int64)
    lag_conf = inp.conf if inp.lagged_conf is None else inp.lagged_conf
    lag_surv = _calibrated_survival(lag_conf, inp, table)
    k = inp.drafted
    if k is not None and 0 < k < gamma:  # a shallower draft: rank its columns only
        surv = surv.reshape(r, gamma)[:, :k].ravel()
        lag_surv = lag_surv.reshape(r, gamma)[:, :k].ravel()
        gamma = k
    if r <= SMALL_BATCH:  # one lagged row a request is a noisy sample: blend in the history
        budget = blended_budget(lag_surv, rate, r, inp.step_time)
    else:
        budget = _global_budget_flat(lag_surv, r, inp.step_time)
    return _top_k_lengths(surv, budget, r, gamma)


def calibrated_zos_plan(inp: StepInput) -> int | None:
    """Before drafting (``inp.conf``: the lagged rows): the budget the step would search, with
    the history's expected survivals standing in for a request too new to have a lagged row,
    drafting priced in; 0 skips the drafter for the step (a lone request too: when even its
    best expected block does not pay for the drafter)."""
    r, gamma = inp.n_requests, inp.gamma
    if r == 0:
        return 0
    table = None if inp.accept_hist is None else calibration_table(inp.accept_hist)
    rate = history_rates(inp.accept_hist, gamma)
    lag_surv = _calibrated_survival(inp.conf, inp, table)
    if inp.lag_known is not None and not bool(np.all(inp.lag_known)):
        lag_surv = lag_surv.reshape(r, gamma).copy()
        lag_surv[~np.asarray(inp.lag_known, dtype=bool)] = np.cumprod(rate)
    flat = lag_surv.ravel()
    d = inp.draft_time(gamma) if inp.draft_time is not None else None
    if r == 1:  # a lone request: its lagged row, or the history, against the drafter's cost
        return 0 if plan_budget(flat, 1, inp.step_time, d) == 0 else None
    if r <= SMALL_BATCH:
        budget = blended_budget(flat, rate, r, inp.step_time, d)
        return 0 if budget == 0 else None
    k = plan_depth(lag_surv.reshape(r, gamma), inp.step_time, inp.draft_time)
    return None if k == gamma else k


def plan_depth(lag_surv: np.ndarray, step_time, draft_time) -> int:
    """The draft depth k = 0..gamma whose best budget gives the most expected tokens per
    second, drafting k tokens a request priced in (k = 0: no drafter).

    Why: a sequential drafter (EAGLE, MTP; the retired roofline profiles priced DSpark so too)
    costs what it drafts (a 7-token block at 256 requests 16.1 ms, one token 8.4 ms, against a
    33 ms step), and under load the budget buys about one draft a request: a plan that only
    chose "nothing or the block" paid for six drafts it never verified and fell below ``mtp1``
    and ``ar`` (issue #33). A parallel drafter (a built DSpark) costs the same at any depth, so
    there the choice is k = 0 or the block. For each k the global search
    runs over the candidates at depth <= k (``lag_surv`` (R, gamma), lagged calibrated
    survivals, ranked once); ties keep the shallower depth. Reads lagged rows and the history
    only, like the budget itself: lossless."""
    r, gamma = lag_surv.shape
    flat = lag_surv.ravel()
    order = np.argsort(-flat, kind="stable")
    ranked = flat[order]
    depth = order % gamma
    t = np.array(_step_times(step_time, r, flat.shape[0] + 1), dtype=np.float64)
    best_k, best = 0, r / float(t[0])
    for k in range(1, gamma + 1):
        vals = ranked if k == gamma else ranked[depth < k]
        d = float(draft_time(k)) if draft_time is not None else 0.0
        theta = (r + np.cumsum(vals)) / (t[1 : vals.shape[0] + 1] + d)
        top = float(theta.max()) if theta.shape[0] else -np.inf
        if top > best:
            best_k, best = k, top
    return best_k


@POLICIES.register(
    "calibrated-zos",
    help="ZOS on confidences calibrated online from verification outcomes (alias: auto)",
)
def calibrated_zos(arg: str | None = None) -> Policy:
    POLICIES.no_arg("calibrated-zos", arg)
    return Policy(
        name="calibrated-zos",
        schedule=calibrated_zos_lengths,
        zos=True,
        needs=frozenset({"lagged_conf", "accept_hist"}),
        plan=calibrated_zos_plan,
        doc=__doc__ or "",
    )


@POLICIES.register("auto", help="the policy to deploy blind: calibrated-zos")
def auto(arg: str | None = None) -> Policy:
    POLICIES.no_arg("auto", arg)
    return calibrated_zos()
