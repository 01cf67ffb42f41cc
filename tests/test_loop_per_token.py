"""The engine loop's cost per verified token (``accept_per_token_ms``): fitted from the
calibration runs' steps on ``1, R, B`` and charged by the simulator on every verified token, so
a full-block step pays for its blocks and a one-token step does not pay for four."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from test_engine_terms import TABLE, trace  # noqa: F401, F811  (its trace fixture)

from specsim.sim.cost.model import CostModel
from specsim.sim.cost.profiles import parse_profile_csv, write_profile_csv
from specsim.sim.simulate import replay

CURVE = ((1, 0.2), (4, 0.9), (16, 3.0))


def calibration_steps(per_token: float, seed: int, ks=(4, 8)) -> pd.DataFrame:  # type: ignore[no-untyped-def]
    """Decode-only steps at R = 1..16 and ``ks`` tokens a request whose loop time is
    0.3 + 0.05 R + per_token B ms plus +-0.1 ms noise (the rest of the step: fixed phases)."""
    gen = np.random.default_rng(seed)
    rows = []
    for r in (1, 2, 4, 8, 16):
        for k in ks:
            for _ in range(12):
                b = r * k
                loop = 0.3 + 0.05 * r + per_token * b + gen.uniform(-0.1, 0.1)
                draft, sched, verify = 20.0 + r, 0.02, 60.0 + 0.5 * b
                rows.append((r, b, (draft + sched + verify + loop) / 1e3, draft / 1e3,
                             sched / 1e3, verify / 1e3))  # fmt: skip
    return pd.DataFrame(
        rows, columns=["decoding", "batch_tokens", "duration_s", "draft_s", "sched_s", "verify_s"]
    )


def test_fit_recovers_the_per_token_cost():
    pytest.importorskip("torch")
    from specsim.torch_engine.overhead import _accept_per_token

    for per_token in (0.0, 0.13, 0.5):
        got = _accept_per_token(calibration_steps(per_token, seed=1))
        assert got == pytest.approx(per_token, abs=0.01)
    # one block length: B = k R, the per-token part cannot be told from the per-request part
    assert _accept_per_token(calibration_steps(0.13, seed=2, ks=(4,))) == 0.0
    # a negative slope is noise, not a refund
    assert _accept_per_token(calibration_steps(-0.2, seed=3)) == 0.0


@pytest.mark.parametrize("gamma", [1, 2, 3, 4, 7, 8])
def test_calibration_passes_verify_different_blocks(gamma):
    """With 3 drafts or fewer, static:3 and static:gamma verify the same tokens and the fit
    above returns 0; the first pass then verifies none. Checked through the policies
    themselves: the tokens a request verifies (drafts + 1) differ between the two passes,
    and the fit recovers the per-token cost from steps at those two block lengths."""
    pytest.importorskip("torch")
    from specsim.policies.base import StepInput, get_policy
    from specsim.torch_engine.overhead import _accept_per_token, calibration_policies

    conf = np.full((2, gamma), 0.5)
    inp = StepInput(conf=conf, step_time=lambda b: 0.01 + 0.0 * np.asarray(b))
    ks = [int(get_policy(p).schedule(inp)[0]) + 1 for p in calibration_policies(gamma)]
    assert ks[0] < ks[1] == gamma + 1
    assert ks[0] == (4 if gamma > 3 else 1)
    got = _accept_per_token(calibration_steps(0.13, seed=4, ks=tuple(ks)))
    assert got == pytest.approx(0.13, abs=0.02)


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
