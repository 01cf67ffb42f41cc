"""Steps rebuilt from a client's streams (specsim.serve.llama_steps) and the profile fitted on
them (specsim.fidelity.llama.profile), checked against the simulator itself: a closed loop
replayed with a known profile is turned into what a client would have seen (one chunk per
token, stamped at the end of the step that emitted it); the rebuilt steps must be the
simulator's steps, and the fit must give the profile back."""

from __future__ import annotations

import numpy as np
import pytest

from specsim.fidelity.llama.profile import StepFit, cost_model, fit_steps, hat_basis
from specsim.serve.bench_config import Result
from specsim.serve.llama_steps import align, request_groups, step_table
from specsim.serve.llama_trace import VERIFY_AS_SERVER, build_trace
from specsim.sim.simulate import replay

LIMITS = {"max_running": 8, "kv_tokens": 1 << 16, "max_batched_tokens": 2048}
TRUE = StepFit(
    knots=(1, 2, 4, 8, 16, 32, 40),
    table_ms=(7.0, 8.5, 11.0, 16.0, 27.0, 50.0, 61.0),
    attn_us=3.0,
    prefill_token_ms=1.5,
    per_request_ms=0.0,
    emit_ms={0.0: 0.0},
)


def _trace(seed: int = 0, n: int = 10, block: int = 3):
    rng = np.random.default_rng(seed)
    plen = rng.integers(20, 120, size=n)
    olen = rng.integers(8, 40, size=n)
    drafted, accepted, tokens = [], [], []
    for length in olen:
        d = rng.integers(0, block + 1, size=length)
        d[0] = 0
        d = np.minimum(d, np.maximum(length - np.arange(length) - 1, 0))
        a = np.array([rng.integers(0, k + 1) for k in d])
        drafted.append(d)
        accepted.append(a)
        tokens.append(rng.integers(1, 50, size=(length, block)))
    meta = {"temperature": "0", "drafter": "test"}
    return build_trace(plen, olen, drafted, accepted, tokens, block, meta), drafted, accepted


def _client_view(res, tr):  # noqa: ANN001, ANN202
    """The Results a streaming client would have recorded for the simulated run."""
    req, tok = res.requests, res.tokens
    results, plen, groups_in = [], [], []
    for job, row in req.iterrows():
        em = tok[tok["id"] == job].sort_values("time_s")
        counts = em["tokens"].to_numpy()
        t = np.repeat(em["time_s"].to_numpy(), counts)
        t = t + 1e-5 * np.concatenate([np.arange(c) for c in counts])  # one after another
        r = Result(job=int(job), trace_id=int(row["trace_index"]), sent_s=float(row["arrival_s"]))
        r.chunk_s, r.chunk_tokens = t.tolist(), [1] * t.shape[0]
        r.output_tokens = int(t.shape[0])
        results.append(r)
        plen.append(int(tr.prompt_len[row["trace_index"]]))
        groups_in.append(int(row["trace_index"]))
    return results, plen, groups_in


@pytest.mark.parametrize("concurrency", [1, 3, 6])
def test_rebuilt_steps_are_the_simulators_and_the_fit_returns_the_profile(concurrency):
    tr, drafted, accepted = _trace()
    cost = cost_model(TRUE, 0.0, "true", LIMITS, {})
    res = replay(tr, VERIFY_AS_SERVER, concurrency=concurrency, requests=14, profile=cost,
                 serving="v2", kv="reserve", **LIMITS)  # fmt: skip
    results, plen, tix = _client_view(res, tr)
    groups = [request_groups(i, r, plen[i], drafted[tix[i]], accepted[tix[i]])
              for i, r in enumerate(results)]  # fmt: skip
    steps, worst = align(groups)
    assert worst < 0.05
    table = step_table(steps, {i: r.sent_s for i, r in enumerate(results)})
    sim = res.steps
    assert len(table) == len(sim)
    np.testing.assert_array_equal(table["batch_tokens"] + table["prefill_tokens"],
                                  sim["batch_tokens"])  # fmt: skip
    np.testing.assert_array_equal(table["running"], sim["running"])
    busy = table["duration_s"].notna().to_numpy()
    assert busy.sum() >= len(table) - 14
    np.testing.assert_allclose(table["duration_s"][busy], sim["duration_s"][busy], atol=1e-4)
    if concurrency > 1:
        table["temperature"] = 0.0
        fit = fit_steps(table)
        got = cost_model(fit, 0.0, "fit", LIMITS, {})
        b = np.arange(1, 41)
        for ctx in (50.0, 400.0):
            np.testing.assert_allclose(got.step_time(b, ctx), cost.step_time(b, ctx), rtol=0.02,
                                       atol=2e-4)  # fmt: skip
        assert fit.prefill_token_ms == pytest.approx(1.5, rel=0.02)


def test_hat_basis_interpolates_and_extends():
    k = (1, 2, 4)
    h = hat_basis(np.array([1, 3, 4, 6]), k)
    np.testing.assert_allclose(h @ np.array([1.0, 2.0, 6.0]), [1.0, 4.0, 6.0, 10.0])
