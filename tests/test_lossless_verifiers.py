"""Table tests of the reference verifiers driven by chosen uniforms, and of the integrator's
safety net (a verifier with unknown thresholds is refused, not mis-integrated)."""

from __future__ import annotations

import numpy as np
import pytest

from specsim.lossless.mutants import accept_le_ratio
from specsim.lossless.uniforms import (
    ONE_BELOW,
    NotPiecewiseConstant,
    block_law,
    edge_uniform_outputs,
    truncated,
)
from specsim.lossless.verifiers import greedy, rejection, sample_from

P = np.array([[0.5, 0.5, 0.0], [0.1, 0.2, 0.7], [0.3, 0.3, 0.4]])  # positions 1, 2, bonus 3
Q = np.array([[0.25, 0.25, 0.5], [0.1, 0.8, 0.1]])


def _one(fn, x, u, v):
    n, tok = fn(P[None], Q[None, : len(x)], np.array([x]), np.array([u], float), np.array([v]))
    return int(n[0]), int(tok[0])


def test_perfect_match_takes_the_bonus_from_the_next_position():
    # x = (0, 2): ratios min(1, .5/.25) = 1 and min(1, .7/.1) = 1: both accepted.
    assert _one(rejection, [0, 2], [0.9, 0.9], 0.95) == (2, 2)  # bonus ~ P[2]: v=.95 -> token 2
    assert _one(rejection, [0, 2], [0.9, 0.9], 0.1) == (2, 0)


def test_early_mismatch_samples_the_residual_at_the_rejected_position():
    # x_1 = 2 has p = 0: always rejected; residual max(P0 - Q0, 0) = (.25, .25, 0) -> (.5, .5, 0).
    assert _one(rejection, [2, 1], [0.0, 0.0], 0.4) == (0, 0)
    assert _one(rejection, [2, 1], [0.0, 0.0], 0.6) == (0, 1)
    # x_2 = 1: ratio .2/.8 = .25; u = .3 rejects; residual (0, 0, .6) -> token 2 whatever v.
    assert _one(rejection, [0, 1], [0.5, 0.3], 0.0) == (1, 2)
    assert _one(rejection, [0, 1], [0.5, 0.2], 0.0) == (2, 0)


def test_sample_from_never_picks_a_zero_probability_token():
    law = np.array([[0.0, 0.3, 0.0, 0.7, 0.0]] * 4)
    v = np.array([0.0, 0.3, 0.2999999, ONE_BELOW])
    assert sample_from(law, v).tolist() == [1, 3, 1, 3]


def test_greedy_breaks_ties_to_the_lowest_id():
    n, tok = _one(greedy, [0, 2], [0.5, 0.5], 0.5)  # argmax P0 = 0 (tie 0/1), argmax P1 = 2
    assert (n, tok) == (2, 2)
    assert _one(greedy, [1, 2], [0.5, 0.5], 0.5) == (0, 0)


def test_u_equal_zero_accepts_a_zero_probability_token_only_with_le():
    x = np.array([2, 0])
    n, tok = edge_uniform_outputs(truncated(accept_le_ratio), P, Q, x, 1)
    assert (n == 1).any()  # u = 0 <= ratio 0: the token P gives 0 is emitted
    n, tok = edge_uniform_outputs(truncated(rejection), P, Q, x, 1)
    assert (n == 0).all()


def test_exact_law_sums_to_one_and_matches_hand_computation():
    law = block_law(truncated(rejection), P, Q, np.array([0, 1]), 2)
    assert abs(law.sum() - 1.0) < 1e-12
    # n = 1 (x_1 accepted w.p. 1, x_2 rejected w.p. .75), token 2 (residual (0, 0, 1)).
    assert abs(law[1, 2] - 0.75) < 1e-12
    np.testing.assert_allclose(law[2], 0.25 * P[2], atol=1e-12)


def test_unknown_thresholds_are_found_and_integrated():
    """A threshold no table defines (v < 1/3) is found by the scan and bisected to 1 ulp."""

    def odd(p, q, x, u, v):
        return np.zeros(x.shape[0], dtype=np.int64), (v < 1 / 3).astype(np.int64)

    law = block_law(truncated(odd), P, Q, np.array([0, 1]), 1)
    np.testing.assert_allclose(law[0, :2], [2 / 3, 1 / 3], rtol=0, atol=1e-15)


def test_a_boundary_that_is_not_axis_aligned_is_refused():
    """u + v < 1 has no product-grid partition: the exact check says it cannot prove it."""

    def diagonal(p, q, x, u, v):
        return np.zeros(x.shape[0], dtype=np.int64), (u[:, 0] + v < 1).astype(np.int64)

    with pytest.raises(NotPiecewiseConstant, match="statistical check"):
        block_law(truncated(diagonal), P, Q, np.array([0, 1]), 1)
