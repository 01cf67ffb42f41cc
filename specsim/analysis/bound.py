"""The best NON-ANTICIPATING scheduler on a synthetic trace: a computed bound (issue #16).

``oracle`` verifies exactly the drafts that will be accepted: it knows the future, so no real
scheduler can reach it. How much of a scheduler's gap to ``oracle`` is that price, and how much is
left to win? This module computes the throughput that NO scheduler which does not know the
current step's outcomes can beat, on the synthetic traces.

Why the synthetic traces, and why the computation is exact there (traces/SYNTHETIC.md,
``specsim.trace.synth``): each row's conditional acceptance probabilities pi_k are drawn i.i.d.
(per row and position), the outcomes are independent Bernoulli(pi_k) given pi, and the stored
confidence IS pi (``calibration = "calibrated"``; the outcome is drawn from the rounded value).
So, given everything a scheduler can see (all current confidences, the whole history), the
expected accepted length of request r verifying l drafts is exactly
``g_r(l) = sum_{k<=l} a_{r,k}`` with survivals ``a_{r,k} = prod_{i<=k} c_{r,i}``, and the next
rows are fresh i.i.d. draws whatever was decided (a request never revisits a row). Nothing has to
be reconstructed. On a recorded trace the confidences are NOT the acceptance probabilities (the
drafter is mis-calibrated, rows are correlated), so the bound is refused there.

The model: a closed loop in steady state with R requests decoding in every step (prefill, the
end of requests and the warm-up and drain of a finite run left out). A step that verifies
lengths l costs ``verify(R + sum l) + fixed`` seconds (the profile's table, at the trace's mean
context for a 2-D profile, plus its engine terms; ``fixed`` = drafting) and yields
``sum_r (1 + g_r(l_r))`` expected tokens; scheduler time is charged as zero (generous: a bound).
The long-run throughput of any policy is a ratio of expectations (renewal reward), and because
the state (the R current rows) is i.i.d. from step to step whatever the policy does, the best
policy is found by Dinkelbach's method: lambda* is the fixed point of
``max E[tokens - lambda * time] = 0``, the maximum taken per step. For every policy that does
not see the current outcomes, E[tokens - lambda* time | what it saw] <= that per-step maximum,
whose mean is 0, so its throughput is at most lambda*: the bound.

The per-step maximum is a knapsack over the batch, solved exactly: because a_{r,k} does not
increase in k, g_r is concave, so the best lengths with n drafts in total are the n largest
survivals over the whole batch (any top-n set is prefix-closed); it remains to pick n, over the
whole step-time curve. ``tests/test_bound.py`` checks this against brute-force search over ALL
deterministic per-step policies on tiny discrete cases.

The expectation over the R current rows is exact for R = 1 (every row of the trace, equally
weighted) and a Monte-Carlo mean over sampled batches for R > 1 (standard error reported;
``oracle`` is evaluated on the same batches, so their ratio is much tighter).

Reading the numbers: ``bound / oracle`` (both in this model) is the price of not knowing the
future; the policy that attains the model's bound (:func:`best_policy`) can be replayed in the
simulator, where ``auto`` can be compared with it on the same runs (the report's table).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from specsim.errors import SpecsimError
from specsim.policies.base import Policy, StepInput
from specsim.sim.cost.model import CostModel
from specsim.trace.model import Trace

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class StepCost:
    """Seconds of one decode step: ``verify[B]`` at every token batch B, plus ``fixed``."""

    verify: np.ndarray
    fixed: float

    def time(self, batch: np.ndarray) -> np.ndarray:
        return self.verify[batch] + self.fixed


@dataclass(frozen=True)
class Bound:
    """The model's numbers at one (trace, profile, R): throughputs in output tokens/s."""

    requests: int
    bound_tok_s: float  # lambda*: the best non-anticipating policy
    bound_se: float  # Monte-Carlo standard error of bound_tok_s (0 when exact)
    oracle_tok_s: float  # ``oracle`` on the same batches
    verified_per_request: float  # drafts the bound's policy verifies per request and step
    batches: int  # sampled batches (R = 1: every row, exact)


def mean_context(trace: Trace) -> float:
    """Mean context (prompt + tokens generated so far) over the trace's decode rows: the context
    at which a 2-D profile's step table is read."""
    out = np.asarray(trace.output_len, dtype=np.float64)
    prompt = np.asarray(trace.prompt_len, dtype=np.float64)
    return float((out * prompt + out * (out - 1) / 2).sum() / out.sum())


def step_cost(cost: CostModel, requests: int, gamma: int, ctx: float | None = None) -> StepCost:
    """The engine's step time with ``requests`` decoding and no prefill (``Engine._loop``):
    the table (at ``ctx`` for a 2-D profile) plus the engine terms, and drafting as ``fixed``.
    Scheduler time is left out (zero: a bound may be generous, never stingy)."""
    batch = np.arange(requests * (gamma + 1) + 1)
    verify = np.asarray(cost.step_time(batch, ctx), dtype=np.float64)
    verify = verify + cost.overhead_ms(requests) * 1e-3
    fixed = cost.draft_ms(requests, gamma) * 1e-3
    if ctx is not None:
        fixed += cost.draft_context_s(np.full(requests, int(round(ctx)) - 1))
    return StepCost(verify=verify, fixed=float(fixed))


def survivals(conf: np.ndarray) -> np.ndarray:
    """a_k = prod_{i<=k} c_i along the last axis, in float64."""
    return np.cumprod(np.asarray(conf, dtype=np.float64), axis=-1)


def top_gains(surv: np.ndarray) -> np.ndarray:
    """(N, R, gamma) survivals -> (N, R*gamma+1): the best expected accepted drafts with n drafts
    verified in total, n = 0..R*gamma (the sum of the n largest survivals; exact because each
    request's g_r is concave, see the module docstring)."""
    n = surv.shape[0]
    flat = -np.sort(-surv.reshape(n, -1), axis=1)
    return np.concatenate([np.zeros((n, 1)), np.cumsum(flat, axis=1)], axis=1)


def dinkelbach(gain: np.ndarray, requests: int, cost: StepCost) -> tuple[float, np.ndarray]:
    """The best long-run tokens/s over per-batch choices of n, and the choice.

    ``gain`` (N, M+1): expected accepted drafts of each of N equally likely batches with n = 0..M
    drafts verified. Dinkelbach: from the ratio of the policy that verifies nothing, pick per
    batch the n maximising tokens - lambda * time, set lambda to the new policy's ratio, until
    it stops rising; it then solves max E[tokens - lambda time] = 0 (finite: each round is a
    strictly better policy of a finite set).
    """
    return _dinkelbach(gain, requests, cost, lambda x: float(x.mean()))


def _dinkelbach(gain: np.ndarray, requests: int, cost: StepCost, avg) -> tuple[float, np.ndarray]:  # noqa: ANN001
    """The Dinkelbach loop of :func:`dinkelbach`, with ``avg`` the expectation over batches."""
    m = gain.shape[1]
    time = cost.time(requests + np.arange(m))
    tokens = requests + gain
    rows = np.arange(gain.shape[0])
    lam = avg(tokens[:, 0]) / float(time[0])
    for _ in range(200):
        choice = np.argmax(tokens - lam * time, axis=1)
        new = avg(tokens[rows, choice]) / avg(time[choice])
        if new <= lam * (1.0 + 1e-13):
            return max(lam, new), choice
        lam = new
    raise SpecsimError("internal: Dinkelbach did not converge in 200 rounds")


def check_synthetic(trace: Trace) -> None:
    """Refuse a trace whose confidences are not its acceptance probabilities."""
    import json

    params = json.loads(trace.meta.get("specsim.synth", "null") or "null")
    if trace.meta.get("source") != "synthetic" or not params:
        raise SpecsimError(
            "the non-anticipating bound needs a synthetic trace (specsim traces synth): only there "
            "are the confidences the true acceptance probabilities"
        )
    if params.get("calibration") != "calibrated":
        raise SpecsimError(
            f"this synthetic trace is mis-calibrated on purpose (calibration "
            f"{params.get('calibration')}): its confidences are not the acceptance probabilities"
        )


def sample_rows(trace: Trace, requests: int, batches: int, seed: int) -> np.ndarray:
    """(N, R) row indices: every row once for R = 1 (exact), else ``batches`` seeded draws."""
    n_rows = int(trace.offsets[-1])
    if requests == 1:
        return np.arange(n_rows)[:, None]
    return np.random.default_rng(seed).integers(0, n_rows, size=(batches, requests))


def default_batches(requests: int) -> int:
    """Monte-Carlo batches: about 200,000 sampled rows, 500 to 20,000 batches."""
    return int(np.clip(200_000 // max(requests, 1), 500, 20_000))


def stationary_bound(
    trace: Trace,
    cost: CostModel,
    requests: int,
    *,
    batches: int | None = None,
    seed: int = 0,
) -> Bound:
    """The bound (and ``oracle`` on the same batches) at ``requests`` in flight, in the model."""
    check_synthetic(trace)
    gamma = trace.block_size
    idx = sample_rows(trace, requests, batches or default_batches(requests), seed)
    ctx = mean_context(trace) if cost.is_2d or cost.draft_per_context_us else None
    sc = step_cost(cost, requests, gamma, ctx)
    gain = top_gains(survivals(np.asarray(trace.conf)[idx]))
    lam, choice = dinkelbach(gain, requests, sc)
    rows = np.arange(gain.shape[0])
    tok = requests + gain[rows, choice]
    tim = sc.time(requests + choice)
    se = float(np.std(tok - lam * tim) / tim.mean() / np.sqrt(len(tok))) if requests > 1 else 0.0
    acc = np.minimum(np.asarray(trace.accept_len, dtype=np.int64)[idx], gamma).sum(axis=1)
    oracle = float((requests + acc).mean() / sc.time(requests + acc).mean())
    return Bound(
        requests=requests,
        bound_tok_s=lam,
        bound_se=se,
        oracle_tok_s=oracle,
        verified_per_request=float(choice.mean() / requests),
        batches=int(gain.shape[0]),
    )


# --------------------------------------------------------------- the policy that attains it

LAMBDA_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def lambda_table(
    trace: Trace, cost: CostModel, max_requests: int, *, seed: int = 0
) -> dict[int, float]:
    """lambda*(R) on ``LAMBDA_GRID`` up to ``max_requests`` (and at it), for :func:`best_policy`
    (fewer batches than :func:`stationary_bound`: a policy only needs lambda to a few 0.1%)."""
    grid = sorted({r for r in LAMBDA_GRID if r < max_requests} | {max_requests})
    return {
        r: stationary_bound(
            trace, cost, r, batches=int(np.clip(50_000 // r, 200, 5000)), seed=seed
        ).bound_tok_s
        for r in grid
    }


def best_lengths(surv: np.ndarray, step_time, lam: float) -> np.ndarray:  # noqa: ANN001
    """One step of the bound's policy: the lengths maximising expected tokens - lam * time
    (top survivals of the batch, n over the whole curve; ties go to (request, position) order,
    so every chosen set is prefix-closed)."""
    r, g = surv.shape
    flat = surv.ravel()
    order = np.argsort(-flat, kind="stable")
    gain = np.concatenate([[0.0], np.cumsum(flat[order])])
    value = gain - lam * np.asarray(step_time(np.arange(r, r + r * g + 1)), dtype=np.float64)
    n = int(np.argmax(value))
    return np.bincount(order[:n] // g, minlength=r).astype(np.int64)


def best_policy(lambdas: dict[int, float]) -> Policy:
    """The policy that attains the model's bound, for replay: per step, :func:`best_lengths` at
    lambda*(R) for the R requests decoding (linear in R between the table's points).

    It reads every current confidence of a request (c_{r,k+1..} too), so on a real drafter,
    whose later confidences depend on the earlier drafts, it would anticipate (Appendix A): it
    claims nothing about losslessness, like ``oracle``. On a synthetic trace the confidences
    carry no information about the drafts' fate beyond pi, so it does not know the future. It
    runs as a ZOS policy (its decision time hidden), as the bound charges none.
    """
    rs = np.array(sorted(lambdas), dtype=np.float64)
    lam = np.array([lambdas[int(r)] for r in rs])

    def schedule(inp: StepInput) -> np.ndarray:
        surv = inp.survival if inp.survival is not None else survivals(inp.conf)
        return best_lengths(surv, inp.step_time, float(np.interp(inp.n_requests, rs, lam)))

    return Policy(
        name="best-non-anticipating",
        schedule=schedule,
        zos=True,
        lossless=False,
        needs=frozenset({"survival"}),
        doc="the policy attaining the non-anticipating bound on a synthetic trace",
    )


# ------------------------------------------------------- exact forms for tiny cases (tests)


def discrete_states(
    conf: np.ndarray, probs: Sequence[float], requests: int
) -> tuple[np.ndarray, np.ndarray]:
    """Every batch of ``requests`` rows drawn i.i.d. from m row types: ((m^R, R, gamma)
    confidences, (m^R,) probabilities)."""
    conf = np.asarray(conf, dtype=np.float64)
    p = np.asarray(probs, dtype=np.float64)
    combos = np.array(list(itertools.product(range(conf.shape[0]), repeat=requests)))
    return conf[combos], p[combos].prod(axis=1)


def weighted_dinkelbach(
    gain: np.ndarray, weights: np.ndarray, requests: int, cost: StepCost
) -> float:
    """:func:`dinkelbach` with unequal batch probabilities (exact on discrete cases)."""
    return _dinkelbach(gain, requests, cost, lambda x: float((weights * x).sum()))[0]


def brute_force_best(
    conf: np.ndarray, probs: Sequence[float], requests: int, cost: StepCost
) -> float:
    """The best long-run tokens/s over ALL deterministic per-step policies (every map from a
    batch of row types to a vector of lengths), by enumeration; randomised policies cannot do
    better (a ratio of linear functions peaks at a vertex). Tiny cases only."""
    states, weights = discrete_states(conf, probs, requests)
    gamma = states.shape[2]
    surv = survivals(states)  # (S, R, gamma)
    gains = np.concatenate([np.zeros(surv.shape[:2] + (1,)), np.cumsum(surv, axis=2)], axis=2)
    actions = np.array(list(itertools.product(range(gamma + 1), repeat=requests)))  # (A, R)
    # expected tokens and time of every (state, action)
    tok = requests + gains[:, np.arange(requests)[None, :], actions].sum(axis=2)  # (S, A)
    tim = cost.time(requests + actions.sum(axis=1))  # (A,)
    best = 0.0
    for pick in itertools.product(range(len(actions)), repeat=len(states)):
        p = np.asarray(pick)
        num = float((weights * tok[np.arange(len(states)), p]).sum())
        den = float((weights * tim[p]).sum())
        best = max(best, num / den)
    return best


# ------------------------------------------------------------------------ the report's table


def bound_table(
    sweeps: pd.DataFrame,
    traces: dict[str, Trace],
    *,
    requests: int,
    seed: int = 0,
) -> pd.DataFrame:
    """Per (profile, trace, load) of ``sweeps`` (the auto section's sweep rows, with their
    profile column) on the synthetic ``traces``: the model's bound and oracle at R = load, and
    the bound's policy replayed in the simulator on the same cell (same seed, same requests)."""
    import pandas as pd

    from specsim.sim.cost.profiles import get_profile
    from specsim.sim.simulate import replay

    rows = []
    cells = sweeps[sweeps["trace"].isin(list(traces))]
    for (prof, name), group in cells.groupby(["profile", "trace"], sort=False):
        cost = get_profile(str(prof))
        trace = traces[str(name)]
        loads = sorted({int(c) for c in group["concurrency"]})
        lambdas = lambda_table(trace, cost, max(loads), seed=seed)
        policy = best_policy(lambdas)
        for load in loads:
            b = stationary_bound(trace, cost, load, seed=seed)
            cell_seed = int(group.loc[group["concurrency"] == load, "seed"].iloc[0])
            sim = replay(
                trace,
                policy,
                concurrency=load,
                requests=requests,
                profile=cost,
                seed=cell_seed,
                record_tokens=False,
                record_steps=False,
            ).summary
            rows.append(
                {
                    "profile": prof,
                    "trace": name,
                    "load": load,
                    "model bound tok/s": b.bound_tok_s,
                    "model bound se": b.bound_se,
                    "model oracle tok/s": b.oracle_tok_s,
                    "model verified per request": b.verified_per_request,
                    "model batches": b.batches,
                    "best-non-anticipating tok/s": sim["throughput_tok_s"],
                    "seed": cell_seed,
                }
            )
    return pd.DataFrame(rows)
