"""The engine loop's cost per verified token (``accept_per_token_ms``): charged by the
simulator on every verified token, so a full-block step pays for its blocks and a one-token step
does not pay for four. (Its fit from the torch engine's calibration steps left with that engine,
retired at commit 574e4c8.)"""

from __future__ import annotations

import numpy as np
import pytest
from test_engine_terms import TABLE, trace  # noqa: F401, F811  (its trace fixture)

from specsim.sim.cost.model import CostModel
from specsim.sim.cost.profiles import parse_profile_csv, write_profile_csv
from specsim.sim.simulate import replay

CURVE = ((1, 0.2), (4, 0.9), (16, 3.0))


@pytest.mark.parametrize("policy", ["static:1", "static:3"])
def test_each_step_pays_per_verified_token(trace, policy):  # noqa: F811
    """duration with the term = duration without it + accept_per_token_ms x (anchors +
    verified drafts), step by step (static policies: no decision depends on cost)."""
    kw = {"profile": None, "concurrency": 4, "seed": 0, "record_tokens": False}
    base = CostModel("b", **TABLE, overhead_curve=CURVE)
    cost = CostModel("t", **TABLE, overhead_curve=CURVE, accept_per_token_ms=0.13)
    a = replay(trace, policy, **{**kw, "profile": base}).steps
    b = replay(trace, policy, **{**kw, "profile": cost}).steps
    np.testing.assert_array_equal(a["batch_tokens"], b["batch_tokens"])
    verified = (b["decoding"] + b["verified_drafts"]).to_numpy()
    assert verified.max() > verified[verified > 0].min()  # steps of several sizes
    np.testing.assert_allclose(b["duration_s"] - a["duration_s"], 0.13e-3 * verified, atol=1e-12)
    assert cost.verify_s(10, 0, 2, cost.step_time_fn(None)) == pytest.approx(
        cost.step_time(10) + (cost.overhead_ms(2) + 1.3) * 1e-3
    )


def test_term_round_trips_through_csv(tmp_path):
    cost = CostModel("t", **TABLE, overhead_curve=CURVE, accept_per_token_ms=0.1325)
    back = parse_profile_csv(write_profile_csv(cost, tmp_path / "p.csv").read_text(), "t")
    assert back.accept_per_token_ms == 0.1325 and back.scalars() == cost.scalars()
    assert CostModel("a", **TABLE, accept_per_token_ms=0.1).has_engine_terms
