"""The measured-engine cost terms (specsim.sim.cost.model): each one charged exactly where the real
engine pays it, and a profile without them replays bit for bit as before."""

from __future__ import annotations

import numpy as np
import pytest

from specsim.errors import SpecsimError
from specsim.sim.cost.model import CostModel
from specsim.sim.cost.profiles import parse_profile_csv, write_profile_csv
from specsim.sim.simulate import replay
from specsim.trace.synth import LogNormal, synth_trace

TABLE = {
    "batch_tokens": np.array([1, 4, 8, 16, 64, 256]),
    "step_ms": [5.0, 5.5, 6.0, 8.0, 12.0, 40.0],
}
TERMS = {
    "step_overhead_ms": 0.7,
    "verify_per_request_ms": 0.3,
    "prefill_token_ms": 0.02,
}


@pytest.fixture(scope="module")
def trace():
    return synth_trace(
        n_requests=12,
        accept_profile=[0.8, 0.6, 0.5, 0.4],
        prompt_len=LogNormal(40, 0.5, 8, 120),
        output_len=LogNormal(30, 0.4, 8, 80),
        seed=3,
    )


def run(trace, cost, policy="static:3", concurrency=4, **kw):
    """The terms on the serving model (``static:3`` drafts 3 tokens a step; prompts within one
    step's budget). They were fitted to the mirror engine (specsim's torch engine, retired at
    commit 574e4c8), which ran serving model v1 (retired at 77e1490); these tests ran on v1
    until then."""
    return replay(
        trace, policy, concurrency=concurrency, profile=cost, seed=0, record_tokens=False, **kw
    )


def test_zero_terms_replay_bit_for_bit(trace):
    """Adding the (zero) engine terms to a profile changes nothing (the golden replays hold)."""
    a = run(trace, CostModel("a", **TABLE))
    b = run(trace, CostModel("b", **TABLE, step_overhead_ms=0.0, verify_per_request_ms=0.0))
    assert a.steps["duration_s"].to_numpy().tobytes() == b.steps["duration_s"].to_numpy().tobytes()


def test_each_step_pays_its_terms_exactly(trace):
    """duration = table(decode tokens) + prompt tokens x prefill_token_ms + step overhead +
    per request x running, step by step (static policy: no decision depends on cost)."""
    cost = CostModel("t", **TABLE, **TERMS)
    st = run(trace, cost).steps
    dec_tokens = st["decoding"] + st["verified_drafts"]
    want = (
        cost.step_time(dec_tokens.to_numpy())
        + 0.02e-3 * st["prefill_tokens"]
        + 0.7e-3
        + 0.3e-3 * st["running"]
    )
    np.testing.assert_allclose(st["duration_s"], want, rtol=1e-12)
    assert (st["prefill_tokens"] > 0).any() and (st["prefilling"] == 0).any()
    # the same steps without the terms: prompt tokens go through the table instead
    plain = run(trace, CostModel("p", **TABLE)).steps
    np.testing.assert_array_equal(plain["batch_tokens"], st["batch_tokens"])
    np.testing.assert_allclose(plain["duration_s"], cost.step_time(st["batch_tokens"].to_numpy()))


def test_draft_context_term(trace):
    """Drafting grows with each decoding request's context, capped at the window."""
    cost = CostModel("c", **TABLE, draft_per_context_us=10.0, draft_context_window=50)
    assert cost.draft_context_s(np.array([10, 49, 500])) == pytest.approx(10e-6 * (10 + 49 + 50))
    st = run(trace, cost).steps
    base = run(trace, CostModel("b", **TABLE)).steps
    extra = (st["duration_s"] - base["duration_s"]).to_numpy()
    dec = st["decoding"].to_numpy()
    assert np.all(extra[dec == 0] == 0)
    assert np.all(extra[dec > 0] > 0) and np.all(extra <= 10e-6 * 50 * dec + 1e-15)
    unbounded = run(trace, CostModel("u", **TABLE, draft_per_context_us=10.0)).steps
    assert (unbounded["duration_s"] >= st["duration_s"]).all()
    assert (unbounded["duration_s"] > st["duration_s"]).any()  # contexts beyond 50 tokens


def test_policies_see_prompt_tokens_at_their_cost():
    cost = CostModel("t", **TABLE, prefill_token_ms=0.02)
    fn = cost.policy_step_fn(cost.step_time_fn(None), 100)
    assert fn(8) == pytest.approx(cost.step_time(8) + 100 * 0.02e-3)
    plain = CostModel("p", **TABLE)
    assert plain.policy_step_fn(plain.step_time_fn(None), 100)(8) == pytest.approx(
        plain.step_time(108)
    )
    assert plain.policy_step_fn(plain.step_time_fn(None), 0) is not None


def test_terms_round_trip_through_csv(tmp_path):
    cost = CostModel("t", **TABLE, **TERMS, draft_per_context_us=1.5, draft_context_window=192)
    back = parse_profile_csv(write_profile_csv(cost, tmp_path / "p.csv").read_text(), "t")
    assert back.scalars() == cost.scalars() and back.has_engine_terms
    assert not CostModel("p", **TABLE).has_engine_terms


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"verify_per_request_ms": -1.0}, "verify_per_request_ms"),
        ({"prefill_token_ms": float("nan")}, "prefill_token_ms"),
        ({"draft_context_window": -5}, "draft_context_window"),
    ],
)
def test_bad_terms_are_refused(kw, needle):
    with pytest.raises(SpecsimError, match=needle):
        CostModel("bad", **TABLE, **kw)


CURVE = ((1, 0.1), (2, 0.2), (4, 1.5), (8, 4.0))


def test_overhead_curve_is_charged_at_each_step(trace):
    """A measured overhead curve replaces the straight line: each step pays the curve at its
    running requests (linear between points, the last slope beyond: 4.0 + 0.625 per request)."""
    cost = CostModel("c", **TABLE, overhead_curve=CURVE, step_overhead_ms=9.0)
    assert cost.has_engine_terms
    assert cost.overhead_ms(1) == pytest.approx(0.1) and cost.overhead_ms(3) == pytest.approx(0.85)
    assert cost.overhead_ms(12) == pytest.approx(4.0 + 4 * 2.5 / 4)
    np.testing.assert_allclose(cost.overhead_ms(np.array([1, 2, 4])), [0.1, 0.2, 1.5])
    st = run(trace, cost).steps
    want = cost.step_time(
        (st["decoding"] + st["verified_drafts"] + st["prefill_tokens"]).to_numpy()
    )
    want = want + np.interp(st["running"], *np.array(CURVE).T) * 1e-3
    np.testing.assert_allclose(st["duration_s"], want, rtol=1e-12)


def test_overhead_curve_round_trips_and_is_checked(tmp_path):
    cost = CostModel("t", **TABLE, **TERMS, overhead_curve=CURVE)
    back = parse_profile_csv(write_profile_csv(cost, tmp_path / "p.csv").read_text(), "t")
    assert back.overhead_curve == CURVE and back.scalars() == cost.scalars()
    with pytest.raises(SpecsimError, match="ascending"):
        CostModel("bad", **TABLE, overhead_curve=((4, 1.0), (2, 0.5)))
    with pytest.raises(SpecsimError, match="overhead_curve ms"):
        CostModel("bad", **TABLE, overhead_curve=((1, -1.0),))
    text = write_profile_csv(cost, tmp_path / "q.csv").read_text()
    with pytest.raises(SpecsimError, match="requests:ms"):
        parse_profile_csv(text.replace("1:0.1,", "one:0.1,"), "q")


DRAFT_CURVE = ((1, 2.0), (2, 3.0), (4, 8.0), (8, 20.0))


@pytest.mark.parametrize("concurrency", [1, 4])
def test_draft_curve_is_charged_at_each_step(trace, concurrency):
    """A measured draft curve replaces draft_base + draft_per_request R; the per-token term
    still adds R x k (``static:3`` drafts k = 3). Each decoding step pays exactly that."""
    cost = CostModel(
        "d", **TABLE, draft_curve=DRAFT_CURVE, draft_base_ms=50.0, draft_per_request_ms=9.0,
        draft_per_token_ms=0.05,
    )  # fmt: skip
    gamma = trace.block_size
    assert cost.draft_ms(3, gamma) == pytest.approx(5.5 + 0.05 * 3 * gamma)
    assert cost.draft_ms(12, 0) == pytest.approx(20.0 + 4 * 3.0)  # the last slope beyond
    assert cost.draft_ms(0, gamma) == 0.0
    st = run(trace, cost, concurrency=concurrency).steps
    dec = st["decoding"].to_numpy()
    want = cost.step_time((dec + st["verified_drafts"] + st["prefill_tokens"]).to_numpy())
    curve = np.interp(dec, *np.array(DRAFT_CURVE).T) + 0.05 * dec * 3
    want = want + np.where(dec > 0, curve, 0.0) * 1e-3
    np.testing.assert_allclose(st["duration_s"], want, rtol=1e-12)


def test_draft_curve_round_trips_and_is_checked(tmp_path):
    cost = CostModel("t", **TABLE, **TERMS, overhead_curve=CURVE, draft_curve=DRAFT_CURVE)
    back = parse_profile_csv(write_profile_csv(cost, tmp_path / "p.csv").read_text(), "t")
    assert back.draft_curve == DRAFT_CURVE and back.overhead_curve == CURVE
    with pytest.raises(SpecsimError, match="draft_curve needs ascending"):
        CostModel("bad", **TABLE, draft_curve=((4, 1.0), (4, 0.5)))
    with pytest.raises(SpecsimError, match="draft_curve ms"):
        CostModel("bad", **TABLE, draft_curve=((1, float("inf")),))
    text = write_profile_csv(cost, tmp_path / "q.csv").read_text()
    with pytest.raises(SpecsimError, match="draft_curve must read"):
        parse_profile_csv(text.replace("2:3,", "two:3,"), "q")
