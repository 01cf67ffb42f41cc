"""The non-anticipating bound (specsim.analysis.bound): exact against brute force on tiny cases."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from specsim.analysis.bound import (
    best_lengths,
    best_policy,
    brute_force_best,
    dinkelbach,
    discrete_states,
    lambda_table,
    options,
    row_contexts,
    stationary_bound,
    step_cost,
    survivals,
    top_gains,
    weighted_dinkelbach,
)
from specsim.errors import SpecsimError
from specsim.sim.cost.price import StepPrice
from specsim.sim.cost.profiles import get_profile
from specsim.sim.simulate import replay
from specsim.trace.synth import LogNormal, synth_trace


def _cliff(requests: int, gamma: int) -> np.ndarray:
    """A step-shaped curve: flat, then a cliff (the shape that traps early-stop searches)."""
    b = np.arange(requests * (gamma + 1) + 1)
    return np.where(b <= requests + 1, 1.0, 1.9) + 0.02 * b


def _cliff_cost(requests: int, gamma: int, per_token: float = 0.0):
    """The cliff, plus drafting that costs by depth (0.3 + 0.05 k; nothing at k = 0) and
    ``per_token`` seconds per emitted token."""
    verify = _cliff(requests, gamma)

    def cost(k, n, tokens):
        return (
            verify[requests + np.asarray(n)]
            + (0.3 + 0.05 * k if k else 0.0)
            + (per_token * np.asarray(tokens))
        )

    return cost


def test_top_gains_is_the_best_knapsack():
    """For every total n, the n largest survivals = the best lengths with sum n (all vectors)."""
    rng = np.random.default_rng(5)
    r, g = 3, 3
    conf = rng.uniform(0.05, 1.0, size=(4, r, g))
    conf[0, 1, 1] = 1.0  # ties in the survivals
    best = top_gains(survivals(conf))
    for i in range(conf.shape[0]):
        cum = np.concatenate([np.zeros((r, 1)), np.cumsum(survivals(conf[i]), axis=1)], axis=1)
        brute = np.full(r * g + 1, -np.inf)
        for lens in itertools.product(range(g + 1), repeat=r):
            n = sum(lens)
            brute[n] = max(brute[n], sum(cum[k, lens[k]] for k in range(r)))
        np.testing.assert_allclose(best[i], brute, rtol=0, atol=1e-12)


@pytest.mark.parametrize("per_token", [0.0, 0.05])
@pytest.mark.parametrize(
    ("conf", "probs", "requests"),
    [
        ([[0.9, 0.2, 0.8], [0.5, 0.5, 0.5], [0.1, 0.9, 0.9]], [0.5, 0.3, 0.2], 1),
        ([[0.95, 0.6], [0.3, 0.9]], [0.6, 0.4], 2),
        ([[0.8], [0.05]], [0.5, 0.5], 2),
        ([[0.3, 0.2], [0.2, 0.1]], [0.5, 0.5], 2),  # drafting does not pay: the bound skips it
    ],
)
def test_dinkelbach_equals_brute_force_over_all_policies(conf, probs, requests, per_token):
    """The per-step knapsack at the Dinkelbach fixed point is the best of ALL deterministic
    per-step policies (a draft depth chosen unseen, then every map from a batch of rows to
    lengths), on a step-shaped curve, drafting priced by depth, emitted tokens priced too."""
    gamma = len(conf[0])
    cost = _cliff_cost(requests, gamma, per_token)
    states, weights = discrete_states(np.array(conf), probs, requests)
    exact = weighted_dinkelbach(survivals(states), weights, requests, cost)
    brute = brute_force_best(np.array(conf), probs, requests, cost)
    assert exact == pytest.approx(brute, rel=1e-12)
    # equal weights: the sampled form gives the same as the weighted one
    if len(set(probs)) == 1:
        lam, _, _ = dinkelbach(*options(survivals(states), requests, cost))
        assert lam == pytest.approx(exact, rel=1e-12)


def test_dinkelbach_with_equal_weights_is_weighted_dinkelbach():
    rng = np.random.default_rng(1)
    surv = survivals(rng.uniform(0, 1, size=(50, 3, 4)))
    cost = _cliff_cost(3, 4)
    lam, k, choice = dinkelbach(*options(surv, 3, cost))
    same = weighted_dinkelbach(surv, np.full(50, 1 / 50), 3, cost)
    assert lam == pytest.approx(same, rel=1e-12)
    assert choice.shape == (50,) and choice.max() <= 3 * k and 0 <= k <= 4


@pytest.fixture(scope="module")
def tiny_trace():
    return synth_trace(
        n_requests=12,
        accept_profile=(0.8, 0.7, 0.7, 0.6),
        output_len=LogNormal(40, 0.2, 20, 60),
        prompt_len=LogNormal(64, 0.2, 16, 128),
        seed=4,
    )


def test_bound_between_every_static_length_and_the_anticipating_optimum(tiny_trace):
    """R = 1 (exact over the trace's rows): the bound beats every static K (drafting K, as
    ``static:K`` does) in the same model and stays below the best ANTICIPATING per-step policy
    (which sees accept_len)."""
    cost = get_profile("llama-3-8b-h100")
    b = stationary_bound(tiny_trace, cost, 1)
    gamma = tiny_trace.block_size
    sc = step_cost(cost, 1, gamma, row_contexts(tiny_trace)[:, None])
    surv = survivals(np.asarray(tiny_trace.conf))
    cum = np.concatenate([np.zeros((surv.shape[0], 1)), np.cumsum(surv, axis=1)], axis=1)
    for k in range(gamma + 1):
        tok = (1 + cum[:, k])[:, None]
        static = tok.mean() / sc(k, np.array([k]), tok).mean()
        assert b.bound_tok_s >= static * (1 - 1e-12)
    acc = np.asarray(tiny_trace.accept_len, dtype=np.int64)[:, None]
    knows = [1.0 + np.minimum(np.arange(k + 1)[None, :], acc) for k in range(gamma + 1)]
    anticipating, _, _ = dinkelbach(
        knows, [sc(k, np.arange(k + 1), t) for k, t in enumerate(knows)]
    )
    assert b.bound_tok_s <= anticipating
    assert b.bound_tok_s < b.oracle_tok_s  # oracle here: verify exactly accept_len
    assert b.bound_se == 0.0 and b.batches == surv.shape[0]


def test_the_bound_prices_a_step_as_the_simulator_does(tiny_trace):
    """The model's step is the serving model's (StepPrice.seconds): a lone request at row i
    drafting k and verifying n costs drafting k (and, on a built profile, the drafter's read of
    the context up to the anchor) + the table at 1 + n with the engine's per-request and
    per-verified-token terms (``verify_s``) + its KV read at the row's context + the emitted
    tokens' cost, on every built-in profile the bound prices (a 2-D one read at its context)."""
    rows = np.arange(0, int(tiny_trace.offsets[-1]), 37)
    ctx = row_contexts(tiny_trace)
    # the context of row i: its request's prompt + its position
    req = np.searchsorted(tiny_trace.offsets, rows, side="right") - 1
    pos = rows - np.asarray(tiny_trace.offsets)[req]
    assert (ctx[rows] == np.asarray(tiny_trace.prompt_len)[req] + pos).all()
    # The built V4 profiles price MLA's decode attention compute, which can outweigh its KV
    # read there: the bound refuses them (test_refuses_a_step_price_...), so it prices no
    # step on them; every other built-in profile is priced as the simulator prices it.
    for name in ("v4-flash-8xh20", "v4-pro-16xh20"):
        with pytest.raises(SpecsimError, match="attention"):
            step_cost(get_profile(name), 1, 4, ctx[rows][:, None])
    for name in ("llama-3-8b-h100", "vllm-v4-flash-tp4-b300", "smollm2-135m-cpu"):
        cost = get_profile(name)
        price = StepPrice(cost, 4)
        sc = step_cost(cost, 1, 4, ctx[rows][:, None])
        for k, n in ((0, 0), (2, 1), (4, 4)):
            got = sc(k, np.array([n]), np.full((rows.size, 1), 1.0 + n))[:, 0]
            for i, c in enumerate(ctx[rows]):
                table = cost.step_time_fn(float(c) if cost.is_2d else None)
                want = (
                    price.draft_s(1, k)
                    + (cost.draft_context_s(np.array([c - 1])) if k else 0.0)
                    + float(cost.verify_s(1 + n, 0, 1, table, draft_tokens=n))
                    + price.kv_coef * c
                    + price.emit_coef * (1 + n)
                )
                assert got[i] == pytest.approx(want, rel=1e-12), (name, k, n)


def test_the_bound_skips_a_drafter_that_does_not_pay(tiny_trace):
    """Drafting a step costs what the serving model charges; where it costs more than it
    brings, the bound drafts nothing (``ar``), which the earlier model (a full draft every
    step) could not: its 'bound' sat below ``ar``'s throughput."""
    import dataclasses

    cost = get_profile("llama-3-8b-h100")
    # a built profile prices its drafter from a measured curve (which replaces draft_base_ms):
    # 200 ms more at every point of it
    dear = dataclasses.replace(
        cost, name="dear-drafter", draft_curve=tuple((r, ms + 200.0) for r, ms in cost.draft_curve)
    )
    b = stationary_bound(tiny_trace, dear, 4, batches=300)
    assert b.drafted == 0 and b.verified_per_request == 0.0
    kw = dict(concurrency=4, requests=12, profile=dear, seed=3, record_tokens=False)
    ar = replay(tiny_trace, "ar", **kw).summary
    assert ar["verified_draft_tokens"] == 0
    # the model's steady state has no prefill or ends: the sim's ar is slower, never faster
    assert b.bound_tok_s >= ar["throughput_tok_s"]


def test_refuses_a_step_price_that_depends_on_more_than_the_draft_count(tiny_trace):
    import dataclasses

    cost = get_profile("llama-3-8b-h100")
    tree = dataclasses.replace(cost, name="tree", tree_tokens_per_request=3)
    with pytest.raises(SpecsimError, match="tree"):
        stationary_bound(tiny_trace, tree, 1)
    attn = dataclasses.replace(cost, name="mla", attn_us_per_qk_ktoken=40.0)
    with pytest.raises(SpecsimError, match="attention"):
        stationary_bound(tiny_trace, attn, 1)
    cheap = dataclasses.replace(cost, name="gqa", attn_us_per_qk_ktoken=1.0)  # never binds
    assert stationary_bound(tiny_trace, cheap, 1).bound_tok_s == pytest.approx(
        stationary_bound(tiny_trace, cost, 1).bound_tok_s, rel=1e-12
    )


def test_refuses_traces_whose_confidences_are_not_probabilities(tiny_trace):
    over = synth_trace(
        n_requests=4, accept_profile=(0.8, 0.7), output_len=[30], calibration=2.0, seed=1
    )
    with pytest.raises(SpecsimError, match="mis-calibrated"):
        stationary_bound(over, get_profile("llama-3-8b-h100"), 1)
    from dataclasses import replace

    recorded = replace(tiny_trace, meta={**tiny_trace.meta, "source": "recorded"})
    with pytest.raises(SpecsimError, match="synthetic trace"):
        stationary_bound(recorded, get_profile("llama-3-8b-h100"), 1)


def test_best_lengths_are_prefix_closed_and_the_model_choice():
    rng = np.random.default_rng(9)
    conf = rng.uniform(0.2, 1.0, size=(5, 4))
    conf[2, 1:] = 1.0  # equal survivals along a row: ties must keep prefix order
    surv = survivals(conf)
    verify = _cliff(5, 4)
    lam = 3.0
    lens = best_lengths(surv, verify.__getitem__, lam)
    gain = top_gains(surv[None])[0]
    n = int(np.argmax(5 + gain - lam * verify[5 + np.arange(gain.size)]))
    assert lens.sum() == n
    picked = sum(surv[r, : lens[r]].sum() for r in range(5))
    assert picked == pytest.approx(gain[n], abs=1e-12)


def test_best_policy_replays_and_beats_mtp1(tiny_trace):
    cost = get_profile("llama-3-8b-h100")
    table = lambda_table(tiny_trace, cost, 4)
    assert sorted(table) == [1, 2, 3, 4] and all(0 <= k <= 4 for _, k in table.values())
    pol = best_policy(table)
    kw = dict(concurrency=4, requests=12, profile=cost, seed=3, record_tokens=False)
    best = replay(tiny_trace, pol, **kw).summary
    mtp1 = replay(tiny_trace, "mtp1", **kw).summary
    assert best["requests_completed"] == 12
    assert best["throughput_tok_s"] > mtp1["throughput_tok_s"]


SUL_BOUND = """
kind = "schedulers-under-load"
title = "Small"
traces = ["../../traces/small.parquet"]
policies = ["mtp1", "auto", "oracle"]
profile = "llama-3-8b-h100"
concurrency = [1, 4]
requests = 16
sla_targets = [40]
auto_policy = "auto"
auto_reference = ["mtp1", "static:2"]
auto_profiles = ["llama-3-8b-h100"]
auto_concurrency = [1, 4]
auto_requests = 16
bound = true
"""


@pytest.mark.slow
def test_report_section_reads_the_bound(tmp_path, monkeypatch, tiny_trace):
    """The schedulers-under-load auto section gets the bound's table and bound.parquet."""
    import pandas as pd

    from specsim.analysis.report import run_report
    from specsim.trace.io import write_trace

    (tmp_path / "traces").mkdir()
    write_trace(tiny_trace, tmp_path / "traces" / "small.parquet")
    folder = tmp_path / "reports" / "sul"
    folder.mkdir(parents=True)
    (folder / "config.toml").write_text(SUL_BOUND)
    monkeypatch.chdir(tmp_path)
    text = run_report("sul", tmp_path / "reports", workers=1).read_text()
    assert "the price of not knowing the future?" in text
    bound = pd.read_parquet(folder / "bound.parquet")
    assert list(bound["load"]) == [1, 4] and set(bound["trace"]) == {"small"}
    assert (bound["model bound tok/s"] < bound["model oracle tok/s"]).all()
    assert (bound["best-non-anticipating tok/s"] > 0).all()
    assert "Model bound / oracle" in text and "best-non-anticipating" in text
