"""Exact losslessness: enumerated output laws of real verifiers and registry policies.

Hypothesis draws the world (tables with zeros, near-one masses and ties, co-batched requests,
jagged SPS curves) from a seed that is part of the example, so a shrunk failure replays exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from specsim.lossless.check import jagged_batch
from specsim.lossless.mutants import q_threshold_scheduler
from specsim.lossless.oracle import (
    TOLERANCE,
    alone,
    multi_output_law,
    output_law,
    rejection_law,
)
from specsim.lossless.toy import appendix_a_toy, random_toy
from specsim.lossless.uniforms import block_law, truncated
from specsim.lossless.verifiers import (
    greedy,
    rejection,
    rrs_without_replacement,
    specinfer,
    typical,
)
from specsim.rng import stream

EXACT = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=25,
    suppress_health_check=[HealthCheck.too_slow],
)

APPENDIX_SPS = [np.nan, 1.0, 0.5, 0.45]


# --- the paper's Appendix A, exactly -----------------------------------------------------------


def test_appendix_a_global_search_gives_085_015():
    res = output_law(appendix_a_toy(), 1, 2, "hw-aware-global", batch=alone(2, APPENDIX_SPS))
    np.testing.assert_allclose(res.marginal(0), [0.85, 0.15], rtol=0, atol=1e-12)
    assert abs(res.tv - 0.15) < 1e-12
    assert not res.lossless


@pytest.mark.parametrize("policy", ["hw-aware", "zos", "vllm-adaptive", "full", "ar"])
def test_appendix_a_early_stop_and_lagged_budget_keep_07_03(policy):
    res = output_law(appendix_a_toy(), 2, 2, policy, batch=alone(2, APPENDIX_SPS))
    np.testing.assert_allclose(res.marginal(0), [0.7, 0.3], rtol=0, atol=1e-12)
    assert res.tv <= TOLERANCE


# --- strategies ------------------------------------------------------------------------------


@st.composite
def worlds(draw, max_vocab=4, max_gamma=3):
    """(toy, gamma, m, batch) with the toy and batch generated from a drawn seed."""
    seed = draw(st.integers(0, 2**31 - 1))
    vocab = draw(st.integers(2, max_vocab))
    gamma = draw(st.integers(1, max_gamma if vocab <= 3 else 2))
    m = draw(st.integers(1, 3 if gamma <= 2 else 2))
    n_others = draw(st.integers(0, 3))
    toy = random_toy(seed, vocab, zeros=0.4, near_one=0.15, ties=0.2)
    batch = jagged_batch(stream(seed, "batch"), n_others, gamma)
    return toy, gamma, m, batch


# --- verifiers --------------------------------------------------------------------------------


@EXACT
@given(worlds(max_vocab=5))
def test_rejection_sampling_is_lossless_for_any_q(world):
    toy, gamma, m, _ = world
    res = output_law(toy, m, gamma, "full", rule=truncated(rejection))
    assert res.tv <= TOLERANCE, res.worst()


@EXACT
@given(worlds())
def test_greedy_equals_argmax_chain(world):
    toy, gamma, m, batch = world
    res = output_law(toy, m, gamma, "hw-aware", rule=truncated(greedy), batch=batch, greedy=True)
    assert res.tv <= TOLERANCE, res.worst()
    (seq,) = [s for s, w in res.law.items() if w > 0.5]
    prefix: tuple[int, ...] = ()
    for t in seq:  # deterministic tie-break: the lowest id among the maxima
        p = toy.p(prefix)
        assert t == int(np.flatnonzero(p == p.max())[0])
        prefix = (*prefix, t)


@settings(derandomize=True, database=None, deadline=None, max_examples=40)
@given(st.integers(0, 2**31 - 1), st.integers(0, 3))
def test_integrator_matches_closed_form(seed, length):
    rng = np.random.default_rng(seed)
    vocab = int(rng.integers(2, 5))
    p = rng.dirichlet(np.ones(vocab), size=4) * (rng.random((4, vocab)) > 0.3)
    p[:, 0] += 1e-3
    p /= p.sum(axis=1, keepdims=True)
    q = rng.dirichlet(np.ones(vocab), size=3)
    x = rng.integers(vocab, size=3)
    got = block_law(truncated(rejection), p, q, x, length)
    np.testing.assert_allclose(got, rejection_law(p, q, x, length), rtol=0, atol=1e-12)


@settings(derandomize=True, database=None, deadline=None, max_examples=30)
@given(st.integers(0, 2**31 - 1), st.integers(2, 4), st.integers(1, 3))
def test_multi_draft_verifiers_are_lossless(seed, vocab, k):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(vocab, 0.6))
    p[rng.random(vocab) < 0.25] = 0.0
    p = p / p.sum() if p.sum() > 0 else np.full(vocab, 1.0 / vocab)
    q = rng.dirichlet(np.full(vocab, 0.6))
    iid = multi_output_law(specinfer, p, q, k, without_replacement=False)
    np.testing.assert_allclose(iid, p, rtol=0, atol=1e-9)
    k_wo = min(k, vocab)
    wo = multi_output_law(rrs_without_replacement, p, q, k_wo, without_replacement=True)
    np.testing.assert_allclose(wo, p, rtol=0, atol=1e-9)


# --- schedulers from the registry --------------------------------------------------------------


@EXACT
@given(
    worlds(),
    st.sampled_from(
        [
            "full", "static:1", "static:2", "threshold:0.5", "cum-threshold:0.3", "hw-aware",
            "zos", "calibrated-zos", "vllm-adaptive", "vllm-adaptive:1", "llama-dspark:0.5",
            "llama-dspark:0.3:1",
        ]
    ),
)  # fmt: skip
@pytest.mark.slow  # fast suite under 5 min: over 2.8 s alone (CI runs it)
def test_non_anticipating_policies_are_lossless(world, policy):
    toy, gamma, m, batch = world
    res = output_law(toy, m, gamma, policy, batch=batch)
    assert res.tv <= TOLERANCE, (policy, res.worst())


@EXACT
@given(worlds(max_vocab=3), st.integers(0, 2**31 - 1))
def test_law_does_not_depend_on_batch_composition(world, other_seed):
    toy, gamma, m, batch = world
    other = jagged_batch(stream(other_seed, "other"), int(other_seed % 4), gamma)
    a = output_law(toy, m, gamma, "hw-aware", batch=batch).law
    b = output_law(toy, m, gamma, "hw-aware", batch=other).law
    assert set(a) == set(b)
    assert max(abs(a[s] - b[s]) for s in a) <= TOLERANCE


# --- must fail: Hypothesis finds the counterexample, and we show it ---------------------------

FIND = settings(derandomize=True, database=None, deadline=None, max_examples=300)


def _found(world, policy, rule=None, capsys=None) -> float:
    toy, gamma, m, batch = world
    res = output_law(toy, m, gamma, policy, batch=batch, rule=rule)
    seq, got, want = res.worst()
    print(f"counterexample {toy.name}, gamma={gamma}, m={m}: P{seq} = {got:.6f} vs {want:.6f}")
    return res.tv


@pytest.mark.slow  # fast suite under 5 min: over 2.8 s alone (CI runs it)
def test_anticipating_global_search_is_caught():
    world = find(
        worlds(max_vocab=3),
        lambda w: output_law(w[0], w[2], w[1], "hw-aware-global", batch=w[3]).tv > 1e-6,
        settings=FIND,
    )
    assert _found(world, "hw-aware-global") > 1e-6


def test_threshold_on_draft_probability_is_caught():
    world = find(
        worlds(max_vocab=3),
        lambda w: output_law(w[0], w[2], w[1], q_threshold_scheduler, batch=w[3]).tv > 1e-6,
        settings=FIND,
    )
    assert _found(world, q_threshold_scheduler) > 1e-6


def test_typical_acceptance_is_caught():
    rule = truncated(typical)
    world = find(
        worlds(max_vocab=3),
        lambda w: output_law(w[0], w[2], w[1], "full", rule=rule, batch=w[3]).tv > 1e-6,
        settings=FIND,
    )
    assert _found(world, "full", rule=rule) > 1e-6


@EXACT
@given(worlds(), st.integers(0, 2**31 - 1))
def test_calibrated_zos_is_lossless_under_any_history(world, seed):
    """Its calibration reads the verification history of earlier steps: whatever that history
    says (random counts, empty, lopsided), the output law is the target's."""
    import dataclasses

    toy, gamma, m, batch = world
    rng = np.random.default_rng(seed)
    reached = rng.integers(0, 60, (1, gamma, 20)).astype(np.float64) * (rng.random() < 0.8)
    hist = np.stack([reached, np.floor(reached * rng.random(reached.shape))], axis=-1)
    res = output_law(toy, m, gamma, "auto", batch=dataclasses.replace(batch, accept_hist=hist))
    assert res.tv <= TOLERANCE, res.worst()


@EXACT
@given(worlds(), st.integers(0, 2**31 - 1), st.integers(1, 3))
def test_calibrated_zos_with_a_shallower_draft_is_lossless(world, seed, drafted):
    """Its plan may draft fewer tokens than the block (``StepInput.drafted``, priced by depth);
    the schedule then ranks the drafted columns only. Whatever the depth and the history, the
    output law is the target's."""
    import dataclasses

    toy, gamma, m, batch = world
    rng = np.random.default_rng(seed)
    reached = rng.integers(0, 60, (1, gamma, 20)).astype(np.float64)
    hist = np.stack([reached, np.floor(reached * rng.random(reached.shape))], axis=-1)
    shallow = dataclasses.replace(batch, accept_hist=hist, drafted=min(drafted, gamma))
    res = output_law(toy, m, gamma, "auto", batch=shallow)
    assert res.tv <= TOLERANCE, res.worst()
