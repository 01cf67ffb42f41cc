"""The engines' own rules (specsim.policies.engines) against steps worked by hand.

vllm-adaptive, two requests, block 3. Lagged confidences r0 (0.9, 0.8, 0.5), r1 (0.6, 0.5, 0.5):
survivals 0.9, 0.72, 0.36 and 0.6, 0.3, 0.15, ranked 0.9, 0.72, 0.6, 0.36, 0.3, 0.15. Verify
cost (table at R + B tokens) 10, 10, 14, 20, 26, 32, 38 ms at 2..8 tokens.

- Without drafting in the denominator (zos's budget): Theta = 2/10, 2.9/10, 3.62/14, 4.22/20
  = 0.200, 0.290, 0.259, 0.211, then lower: budget 1.
- vLLM's, with a 10 ms drafter: 2/20, 2.9/20, 3.62/24, 4.22/30, 4.58/36 = 0.100, 0.145, 0.151,
  0.141, 0.127, then lower: budget 2 (a fixed draft cost makes a larger batch relatively
  cheaper).
- Allocation from the LIVE confidences r0 (0.5, 0.5, 0.5), r1 (0.95, 0.9, 0.9): survivals 0.5,
  0.25, 0.125 and 0.95, 0.855, 0.77: the top 2 are both r1's: lengths (0, 2).
"""

from __future__ import annotations

import warnings

import numpy as np

from specsim.policies import get_policy
from specsim.policies.base import StepInput
from specsim.policies.engines import budget_search, vllm_lagged_survival

LAGGED = np.array([[0.9, 0.8, 0.5], [0.6, 0.5, 0.5]])
LIVE = np.array([[0.5, 0.5, 0.5], [0.95, 0.9, 0.9]])
TABLE_MS = {2: 10, 3: 10, 4: 14, 5: 20, 6: 26, 7: 32, 8: 38}


def _step_time(batch):
    return np.vectorize(lambda x: TABLE_MS[int(x)] / 1000)(np.asarray(batch)).astype(np.float64)


def _inp(draft_s, known=None):
    return StepInput(
        conf=LIVE, step_time=_step_time, lagged_conf=LAGGED, lag_known=known,
        draft_time=(lambda k: draft_s if k > 0 else 0.0) if draft_s is not None else None,
    )  # fmt: skip


def test_budget_search_by_hand():
    surv = np.cumprod(LAGGED, axis=1)
    assert budget_search(surv, 2, _step_time) == 1
    assert budget_search(surv, 2, _step_time, draft_s=0.010) == 2


def test_vllm_adaptive_worked_step():
    pol = get_policy("vllm-adaptive")
    assert pol.zos and pol.lossless and {"draft_time", "lag_known"} <= pol.needs
    assert pol(_inp(0.010)).tolist() == [0, 2]
    assert pol(_inp(None)).tolist() == [0, 1]  # no drafting priced: zos's budget
    zos = get_policy("zos")(_inp(None))
    assert zos.tolist() == [0, 1]


def test_a_request_without_confidences_is_seeded_with_one():
    """vLLM seeds a new request's confidences with 1.0: r1 unknown ranks its three candidates
    first (1, 1, 1, then r0's 0.9, 0.72, 0.36). With a 12 ms drafter: Theta 2/22, 3/22, 4/26,
    5/32, 5.9/38 = 0.091, 0.136, 0.154, 0.156, 0.155: budget 3 (with r1's real lagged row:
    2)."""
    inp = _inp(0.012, known=np.array([True, False]))
    surv = vllm_lagged_survival(inp).reshape(2, 3)
    np.testing.assert_allclose(surv[0], [0.9, 0.72, 0.36])
    np.testing.assert_allclose(surv[1], [1.0, 1.0, 1.0])
    assert budget_search(surv, 2, _step_time, 0.012) == 3
    assert get_policy("vllm-adaptive")(inp).tolist() == [0, 3]  # top 3 of the live rows: r1's
    assert get_policy("vllm-adaptive")(_inp(0.012)).tolist() == [0, 2]


def test_vllm_adaptive_replays_and_prices_its_drafting():
    """In the simulator the rule gets the engine's draft cost: with a drafter 100x as costly
    the budget grows (a fixed cost is amortised over more tokens), never shrinks."""
    from dataclasses import replace

    from specsim.sim.cost_profiles import get_profile
    from specsim.sim.simulate import replay
    from specsim.sim.toy import iid_trace

    tr = iid_trace(24, 60, gamma=7, alpha=0.6, seed=3)
    base = get_profile("vllm-v4-flash-tp4-b300")
    dear = replace(base, draft_curve=tuple((r, m * 100) for r, m in base.draft_curve))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cheap = replay(tr, "vllm-adaptive", concurrency=8, requests=24, profile=base).summary
        costly = replay(tr, "vllm-adaptive", concurrency=8, requests=24, profile=dear).summary
    assert costly["verified_draft_tokens"] > cheap["verified_draft_tokens"]


def test_llama_dspark_worked_step():
    """llama.cpp's draft-dspark cut (docs/llama-cpp-dspark.md row 13): drafts before the first
    confidence below P; P = 0 keeps the block; N caps it; a cut at position 1 is no draft."""
    import pytest

    from specsim.errors import SpecsimError

    conf = np.array([[0.9, 0.6, 0.4, 0.8], [0.3, 0.9, 0.9, 0.9], [0.7, 0.7, 0.7, 0.7]])
    inp = StepInput(conf=conf, step_time=_step_time)
    assert get_policy("llama-dspark:0.5")(inp).tolist() == [2, 0, 4]
    assert get_policy("llama-dspark:0.5:3")(inp).tolist() == [2, 0, 3]
    assert get_policy("llama-dspark")(inp).tolist() == [4, 4, 4]
    assert get_policy("llama-dspark:0.65")(inp).tolist() == [1, 0, 4]
    pol = get_policy("llama-dspark:0.5")
    assert pol.rowwise and pol.lossless
    assert pol.solo(conf, np.zeros(3), _step_time).tolist() == [2, 0, 4]
    for bad in ("llama-dspark:1.5", "llama-dspark:x", "llama-dspark:0.5:-1", "llama-dspark:1:2:3"):
        with pytest.raises(SpecsimError, match="llama-dspark"):
            get_policy(bad)
