"""``replay()`` options: STS calibration, 2-D profiles, closed-loop duration, profile folders,
user policies that misbehave."""

from __future__ import annotations

import numpy as np
import pytest

from specsim.errors import SpecsimError
from specsim.policies import Policy, StepInput
from specsim.sim.cost.model import CostModel
from specsim.sim.cost.profiles import PROFILES, get_profile, register_csv_folder
from specsim.sim.simulate import replay
from specsim.sim.toy import iid_trace


def _overconfident():
    from specsim.trace.synth import synth_trace

    return synth_trace(n_requests=60, accept_profile=(0.7, 0.6, 0.5, 0.4), calibration=3.0, seed=2)


def test_sts_calibration_holds_out_and_changes_confidences():
    tr = _overconfident()
    raw = replay(tr, "cum-threshold:0.3", concurrency=8, seed=1)
    cal = replay(tr, "cum-threshold:0.3", concurrency=8, seed=1, calibrate="sts")
    temps = cal.config["sts_temperatures"]
    assert len(temps) == 4 and all(t > 1.0 for t in temps)  # over-confident: T > 1 flattens
    assert cal.config["trace_requests"] == 42  # 70% of 60 replayed, 30% fitted
    assert raw.config["trace_requests"] == 60
    # the replayed requests are exactly the held-in 70%, never the ones STS was fitted on
    from specsim.policies.calibrate import split_requests

    fit, rest = split_requests(60, 0.3, seed=1)
    replayed = set(cal.requests["trace_request"])
    assert replayed <= set(tr.request_ids[rest]) and not replayed & set(tr.request_ids[fit])
    # calibrated survivals change what a survival threshold verifies
    per_step = [r.summary["verified_draft_tokens"] / r.steps["decoding"].sum() for r in (raw, cal)]
    assert abs(per_step[1] - per_step[0]) > 0.01
    with pytest.raises(SpecsimError, match="sts"):
        replay(tr, "ar", calibrate="platt")


def test_2d_profile_costs_context(tmp_path):
    p = tmp_path / "ctx.csv"
    p.write_text(
        "context_tokens,batch_tokens,step_ms\n0,1,10\n0,4096,10\n1000,1,20\n1000,4096,20\n"
    )
    tr = iid_trace(1, 1000, alpha=0.0, prompt_len=0)
    st = replay(tr, "ar", concurrency=1, profile=str(p)).steps
    # one request, context = position n: the step grows linearly from 10 ms to ~20 ms
    n = np.arange(1, len(st))  # decode steps at positions 1..999
    np.testing.assert_allclose(st["duration_s"].to_numpy()[1:], (10 + 10 * n / 1000) / 1000)


def test_closed_loop_duration():
    tr = iid_trace(20, 30, alpha=0.6)
    res = replay(tr, "hw-aware", concurrency=4, duration=2.0, seed=0)
    arr = res.requests["arrival_s"]
    assert arr.max() <= 2.0
    assert len(res.requests) > 20  # the permutation cycled past the trace's 20 requests
    assert res.summary["requests_completed"] == len(res.requests)


def test_profiles_folder_registers_by_stem(tmp_path):
    (tmp_path / "zz-test-gpu.csv").write_text("# kv_tokens: 999\nbatch_tokens,step_ms\n1,5\n9,6\n")
    (tmp_path / "notes.txt").write_text("not a profile")
    assert register_csv_folder(tmp_path) == ["zz-test-gpu"]
    assert "zz-test-gpu" in PROFILES.names()
    m = get_profile("zz-test-gpu")
    assert m.kv_tokens == 999 and m.step_time(5) == pytest.approx(0.0055)
    assert register_csv_folder(tmp_path) == []  # never twice


def test_policy_returning_bad_lengths_is_a_one_line_error():
    bad = Policy(name="bad", schedule=lambda inp: np.full(inp.n_requests, inp.gamma + 1))
    with pytest.raises(SpecsimError, match="outside") as exc:
        replay(iid_trace(3, 10), bad, concurrency=2)
    assert "\n" not in str(exc.value)
    short = Policy(name="short", schedule=lambda inp: np.zeros(1, dtype=np.int64))
    with pytest.raises(SpecsimError, match="shape"):
        replay(iid_trace(3, 10), short, concurrency=3)


def test_goodput_sees_an_online_estimate_that_converges():
    seen = []

    def spy(inp: StepInput) -> np.ndarray:
        seen.append(inp.accept_rate.copy())
        return np.full(inp.n_requests, inp.gamma, dtype=np.int64)

    pol = Policy(name="spy", schedule=spy, needs=frozenset({"accept_rate"}))
    alpha = 0.75
    replay(iid_trace(4, 3000, gamma=3, alpha=alpha), pol, concurrency=4, profile=_flat())
    np.testing.assert_allclose(seen[0], 0.5)  # the prior before anything is verified
    last = seen[-1]
    # ~4 x 3000 / 2.3 request-steps reach position 1: SE ~ sqrt(.19 / 5000) = 0.006
    assert np.all(np.abs(last - alpha) < 5 * 0.0062 * np.array([1.0, 1.4, 1.8]))


def _flat() -> CostModel:
    return CostModel("flat", np.array([1, 4096]), [10.0, 10.0])
