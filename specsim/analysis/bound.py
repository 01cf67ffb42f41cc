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
end of requests and the warm-up and drain of a finite run left out), each step priced as the
serving model prices it, by the same function (:meth:`specsim.sim.cost.price.StepPrice.seconds`,
:func:`step_cost`). As in the simulator, a step first decides how many tokens k the drafter
produces for every request (0: the drafter is skipped), BEFORE the step's rows are seen, then
verifies lengths l_r <= k; it costs drafting k (``draft_ms(R, k)``) + the table at
``R + sum l`` (a 2-D one at the batch's mean context) with a measured engine's terms + the KV
each request reads at its own context (its row's prompt + position) + ``emit_per_token_ms`` per
emitted token, and yields ``sum_r (1 + g_r(l_r))`` expected tokens; scheduler time is charged
as zero (generous: a bound). The long-run throughput of any policy is a ratio of expectations
(renewal reward), and because the state (the R current rows) is i.i.d. from step to step
whatever the policy does, the best policy is found by Dinkelbach's method: lambda* is the fixed
point of ``max E[tokens - lambda * time] = 0``, the maximum taken per step (over k in
expectation, as k is chosen unseen; over l per batch). For every policy that does not see the
current outcomes, E[tokens - lambda* time | what it saw] <= that per-step maximum, whose mean
is 0, so its throughput is at most lambda*: the bound. The rows a step sees are sampled
uniformly over the trace's rows, contexts included (about what a closed loop visits: every
policy walks each request's positions at a pace of tau tokens a step). A profile whose step
price depends on more than the number of drafts (a tree's other branches, decode attention's
compute above its KV read) is refused: there the knapsack below is not exact.

The per-step maximum is a knapsack over the batch, solved exactly: because a_{r,k} does not
increase in k, g_r is concave, so the best lengths with n drafts in total, each at most k, are
the n largest survivals of the batch's first k positions (any top-n set is prefix-closed); it
remains to pick n over the whole step-time curve, and k. ``tests/test_bound.py`` checks this
against brute-force search over ALL deterministic per-step policies on tiny discrete cases.

The expectation over the R current rows is exact for R = 1 (every row of the trace, equally
weighted) and a Monte-Carlo mean over sampled batches for R > 1 (standard error reported;
``oracle`` is evaluated on the same batches, so their ratio is much tighter).

Reading the numbers: ``bound / oracle`` (both in this model) is the price of not knowing the
future; the policy that attains the model's bound (:func:`best_policy`) can be replayed in the
simulator, where ``auto`` can be compared with it on the same runs (the report's table).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from specsim.errors import SpecsimError
from specsim.policies.base import Policy, StepInput
from specsim.sim.cost.model import CostModel
from specsim.sim.cost.price import StepPrice
from specsim.trace.model import Trace

if TYPE_CHECKING:
    import pandas as pd


# seconds of one decode step of the model's R requests drafting k tokens each and verifying n
# drafts between them, emitting ``tokens`` (arrays broadcast: a row per batch where the step's
# cost differs by batch): ``cost(k, n, tokens)``
StepCost = Callable[[int, np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Bound:
    """The model's numbers at one (trace, profile, R): throughputs in output tokens/s."""

    requests: int
    bound_tok_s: float  # lambda*: the best non-anticipating policy
    bound_se: float  # Monte-Carlo standard error of bound_tok_s (0 when exact)
    oracle_tok_s: float  # ``oracle`` on the same batches
    verified_per_request: float  # drafts the bound's policy verifies per request and step
    batches: int  # sampled batches (R = 1: every row, exact)
    drafted: int  # the draft depth k the bound's policy drafts every step (0: no drafter)


def row_contexts(trace: Trace) -> np.ndarray:
    """Each trace row's context, the prompt plus the tokens generated before it: what the
    serving model reads of a request decoding at that row (its KV, a 2-D table's context)."""
    out = np.asarray(trace.output_len, dtype=np.int64)
    prompt = np.asarray(trace.prompt_len, dtype=np.int64)
    start = np.asarray(trace.offsets, dtype=np.int64)[:-1]
    rows = np.arange(int(out.sum()), dtype=np.int64)
    return np.repeat(prompt - start, out) + rows


class _BatchTable:
    """A 2-D profile's table at each batch's own context (the decoders' mean, as the serving
    model reads it), ``B -> seconds`` with a row per batch; tabulated once per context."""

    def __init__(self, cost: CostModel, ctx: np.ndarray, b_max: int) -> None:
        uniq, self.inv = np.unique(ctx, return_inverse=True)
        grid = np.arange(b_max + 1)
        self.rows = np.stack([np.asarray(cost.step_time(grid, float(c))) for c in uniq])

    def __call__(self, batch):  # noqa: ANN001, ANN204
        b = np.broadcast_to(np.asarray(batch), (self.inv.shape[0], np.shape(batch)[-1]))
        return np.take_along_axis(self.rows[self.inv], b, axis=1)


def step_cost(cost: CostModel, requests: int, gamma: int, contexts: np.ndarray) -> StepCost:
    """The serving model's price of a decode step of ``requests`` requests at ``contexts``
    ((N, R): each batch's requests' contexts), as :meth:`StepPrice.seconds` prices the
    simulator's: drafting k tokens (nothing at k = 0), the table (a 2-D one at the batch's
    mean context) with a measured engine's terms, the KV each request reads at its own
    context, the emitted tokens' cost. Scheduler time is left out (zero: a bound may be
    generous, never stingy). Refused where the best lengths would depend on more than how
    many drafts are verified (a tree's other branches ride along only with a request that
    verifies one; decode attention's compute can outweigh the KV read)."""
    price = StepPrice(cost, gamma)
    if price.tree_extra:
        raise SpecsimError(
            f"profile {cost.name!r} verifies a tree ({price.tree_extra} tokens a speculating "
            "request beyond its path): the bound's step price would depend on how many "
            "requests verify a draft, not only on how many drafts; not computed"
        )
    if price.by_slot:
        raise SpecsimError(
            f"profile {cost.name!r} cuts a step into forward passes by slot (passes_by_slot): "
            "the bound's step price would depend on which requests verify how many drafts, "
            "not only on how many; not computed"
        )
    if price.attn_coef * (1 + gamma) > price.kv_coef:
        raise SpecsimError(
            f"profile {cost.name!r}: decode attention's compute (attn_us_per_qk_ktoken) can "
            "outweigh its KV read, which makes the best lengths depend on each request's "
            "context; the bound is not computed on such a profile"
        )
    ctx = np.asarray(contexts, dtype=np.int64)
    n_batch = ctx.shape[0]
    kv = ctx.sum(axis=1)[:, None]  # every decoder's cache and anchor
    if cost.is_2d:
        mean = np.add.reduce(ctx, axis=1, dtype=np.float64) / requests
        table = _BatchTable(cost, mean, requests * (gamma + 1))
    else:
        table = cost.step_time_fn(None)
    dctx = 0.0
    if price.engine_terms and cost.draft_per_context_us:  # the drafter reads up to each anchor
        dctx = np.array([cost.draft_context_s(c - 1) for c in ctx])[:, None]

    def seconds(k: int, n: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        t = price.seconds(table, requests=requests, decode=requests, drafts=n, drafted=k,
                          draft_context=dctx, kv=kv, emitted=tokens)  # fmt: skip
        return np.broadcast_to(t, np.broadcast_shapes(np.shape(tokens), (n_batch, 1)))

    return seconds


def survivals(conf: np.ndarray) -> np.ndarray:
    """a_k = prod_{i<=k} c_i along the last axis, in float64."""
    return np.cumprod(np.asarray(conf, dtype=np.float64), axis=-1)


def top_gains(surv: np.ndarray) -> np.ndarray:
    """(N, R, k) survivals -> (N, R*k+1): the best expected accepted drafts with n drafts
    verified in total, n = 0..R*k (the sum of the n largest survivals; exact because each
    request's g_r is concave, see the module docstring)."""
    n = surv.shape[0]
    flat = -np.sort(-surv.reshape(n, -1), axis=1)
    return np.concatenate([np.zeros((n, 1)), np.cumsum(flat, axis=1)], axis=1)


def options(
    surv: np.ndarray, requests: int, cost: StepCost
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Expected tokens and seconds of every choice, by draft depth k = 0..gamma: (N, R*k+1)
    arrays over n = 0..R*k drafts verified (the best n of the batch's first k positions)."""
    tok, time = [], []
    for k in range(surv.shape[2] + 1):
        t = requests + top_gains(surv[:, :, :k])
        tok.append(t)
        time.append(cost(k, np.arange(t.shape[1]), t))
    return tok, time


def dinkelbach(tok: list[np.ndarray], time: list[np.ndarray]) -> tuple[float, int, np.ndarray]:
    """The best long-run tokens/s over the policies that pick a draft depth k before the step
    (not seeing its rows) and the number n of drafts verified after it, and that policy (k,
    each batch's n).

    ``tok[k]``, ``time[k]`` (N, R*k+1): expected tokens and seconds of each of N equally likely
    batches. Dinkelbach: from the ratio of the policy that drafts nothing, pick the k whose
    per-batch best n maximises the mean of tokens - lambda * time, set lambda to the new
    policy's ratio, until it stops rising; it then solves max E[tokens - lambda time] = 0
    (finite: each round is a strictly better policy of a finite set).
    """
    return _dinkelbach(tok, time, lambda x: float(x.mean()))


def _dinkelbach(tok, time, avg) -> tuple[float, int, np.ndarray]:  # noqa: ANN001
    """The Dinkelbach loop of :func:`dinkelbach`, with ``avg`` the expectation over batches."""
    rows = np.arange(tok[0].shape[0])
    lam = avg(tok[0][:, 0]) / avg(time[0][:, 0])
    for _ in range(200):
        best = None
        for k in range(len(tok)):
            value = tok[k] - lam * time[k]
            choice = np.argmax(value, axis=1)
            v = avg(value[rows, choice])
            if best is None or v > best[0]:
                best = (v, k, choice)
        _, k, choice = best
        new = avg(tok[k][rows, choice]) / avg(time[k][rows, choice])
        if new <= lam * (1.0 + 1e-13):
            return max(lam, new), k, choice
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
    sc = step_cost(cost, requests, gamma, row_contexts(trace)[idx])
    tok, time = options(survivals(np.asarray(trace.conf)[idx]), requests, sc)
    lam, k, choice = dinkelbach(tok, time)
    rows = np.arange(tok[0].shape[0])
    t_tok, t_time = tok[k][rows, choice], time[k][rows, choice]
    se = 0.0
    if requests > 1:
        se = float(np.std(t_tok - lam * t_time) / t_time.mean() / np.sqrt(len(t_tok)))
    # oracle drafts the block and verifies exactly what will be accepted
    acc = np.minimum(np.asarray(trace.accept_len, dtype=np.int64)[idx], gamma).sum(axis=1)
    o_tok = (requests + acc)[:, None]
    oracle = float(o_tok.mean() / sc(gamma, acc[:, None], o_tok).mean())
    return Bound(
        requests=requests,
        bound_tok_s=lam,
        bound_se=se,
        oracle_tok_s=oracle,
        verified_per_request=float(choice.mean() / requests),
        batches=int(rows.shape[0]),
        drafted=int(k),
    )


# --------------------------------------------------------------- the policy that attains it

LAMBDA_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def lambda_table(
    trace: Trace, cost: CostModel, max_requests: int, *, seed: int = 0
) -> dict[int, tuple[float, int]]:
    """(lambda*(R), the draft depth k*(R)) on ``LAMBDA_GRID`` up to ``max_requests`` (and at
    it), for :func:`best_policy` (fewer batches than :func:`stationary_bound`: a policy only
    needs lambda to a few 0.1%)."""
    grid = sorted({r for r in LAMBDA_GRID if r < max_requests} | {max_requests})
    out = {}
    for r in grid:
        n = int(np.clip(50_000 // r, 200, 5000))
        b = stationary_bound(trace, cost, r, batches=n, seed=seed)
        out[r] = (b.bound_tok_s, b.drafted)
    return out


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


def best_policy(table: dict[int, tuple[float, int]], emit_s: float = 0.0) -> Policy:
    """The policy that attains the model's bound, for replay: per step, it drafts k*(R) tokens
    (the nearest point of the table at or below the R requests decoding: a plan, decided
    before the drafter runs) and verifies :func:`best_lengths` at lambda*(R) (linear in R
    between the table's points) of what was drafted. ``emit_s``: the profile's seconds per
    emitted token, which scales what a verified token is worth (1 - lambda x emit_s).

    It reads every current confidence of a request (c_{r,k+1..} too), so on a real drafter,
    whose later confidences depend on the earlier drafts, it would anticipate (Appendix A): it
    claims nothing about losslessness, like ``oracle``. On a synthetic trace the confidences
    carry no information about the drafts' fate beyond pi, so it does not know the future. It
    runs as a ZOS policy (its decision time hidden), as the bound charges none.
    """
    rs = np.array(sorted(table), dtype=np.float64)
    lam = np.array([table[int(r)][0] for r in rs])
    ks = [table[int(r)][1] for r in rs]

    def plan(inp: StepInput) -> int:
        return ks[max(int(np.searchsorted(rs, inp.n_requests, side="right")) - 1, 0)]

    def schedule(inp: StepInput) -> np.ndarray:
        surv = inp.survival if inp.survival is not None else survivals(inp.conf)
        if inp.drafted is not None:
            surv = surv[:, : inp.drafted]
        lr = float(np.interp(inp.n_requests, rs, lam))
        return best_lengths(surv, inp.step_time, lr / (1.0 - lr * emit_s))

    return Policy(
        name="best-non-anticipating",
        schedule=schedule,
        zos=True,
        lossless=False,
        needs=frozenset({"survival"}),
        doc="the policy attaining the non-anticipating bound on a synthetic trace",
        plan=plan,
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
    surv: np.ndarray, weights: np.ndarray, requests: int, cost: StepCost
) -> float:
    """:func:`dinkelbach` over every batch of survivals ``surv`` (S, R, gamma) with unequal
    probabilities ``weights`` (exact on discrete cases)."""
    tok, time = options(surv, requests, cost)
    return _dinkelbach(tok, time, lambda x: float((weights * x).sum()))[0]


def brute_force_best(
    conf: np.ndarray, probs: Sequence[float], requests: int, cost: StepCost
) -> float:
    """The best long-run tokens/s over ALL deterministic stationary policies (a draft depth k
    chosen before the batch is seen, then every map from a batch of row types to lengths of
    at most k), by enumeration; randomised policies cannot do better (a ratio of linear
    functions peaks at a vertex). Tiny cases only."""
    states, weights = discrete_states(conf, probs, requests)
    surv = survivals(states)  # (S, R, gamma)
    gains = np.concatenate([np.zeros(surv.shape[:2] + (1,)), np.cumsum(surv, axis=2)], axis=2)
    best = 0.0
    for k in range(surv.shape[2] + 1):
        actions = np.array(list(itertools.product(range(k + 1), repeat=requests)))  # (A, R)
        # expected tokens and time of every (state, action)
        tok = requests + gains[:, np.arange(requests)[None, :], actions].sum(axis=2)  # (S, A)
        tim = np.broadcast_to(cost(k, actions.sum(axis=1)[None, :], tok), tok.shape)
        for pick in itertools.product(range(len(actions)), repeat=len(states)):
            p = np.asarray(pick)
            num = float((weights * tok[np.arange(len(states)), p]).sum())
            den = float((weights * tim[np.arange(len(states)), p]).sum())
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
        policy = best_policy(lambdas, cost.emit_per_token_ms * 1e-3)
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
                    "model drafted per request": b.drafted,
                    "model batches": b.batches,
                    "best-non-anticipating tok/s": sim["throughput_tok_s"],
                    "seed": cell_seed,
                }
            )
    return pd.DataFrame(rows)
