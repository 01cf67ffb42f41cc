"""The forward passes llama.cpp cuts a server step into (specsim.sim.ubatch), their price in
the simulator, and their term in the llama-server step fit.

Why: llama-server with one KV stream per slot runs one pass per run of consecutive slots
holding as many tokens each (``split_equal(sequential=true)``, llama.cpp b11434); on its
calibration steps a 1-token pass costs ~4.8 ms and six tokens in one pass ~14, so the same
verified tokens cost one pass or several by which slots verify how many
(reports/llama-cpp-v4/PLAN.md, step 4).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from specsim.errors import SpecsimError
from specsim.sim.cost.model import CostModel
from specsim.sim.simulate import replay
from specsim.sim.toy import iid_trace
from specsim.sim.ubatch import pass_sizes, pass_text, ubatch_sizes


@pytest.mark.parametrize(
    ("slots", "tokens", "sizes"),
    [
        ([0, 1, 2], [1, 1, 1], [3]),  # consecutive slots, one token each: one pass
        ([0, 2, 5], [1, 1, 1], [1, 1, 1]),  # scattered: a pass each
        ([3], [5], [5]),  # one request verifying 1 + 4: one pass
        ([0, 1], [1, 4], [2, 3]),  # the fewer tokens first, then the rest of slot 1 alone
        ([0, 1, 2], [2, 1, 2], [3, 1, 1]),  # slot 1 done: 0 and 2 no longer consecutive
        ([5, 4], [2, 2], [4]),  # the batch comes in slot order, whatever order given
        ([6, 7, 0], [1, 3, 1], [1, 2, 2]),  # 0 alone; 6-7 one token each, then 7's last two
    ],
)
def test_the_passes_follow_llama_cpps_split_equal(slots, tokens, sizes):
    assert ubatch_sizes(slots, tokens) == sizes
    assert sum(sizes) == sum(tokens) and pass_sizes(pass_text(sizes)) == sizes


def _cost(by_slot: int, max_running: int) -> CostModel:
    return CostModel(
        name=f"p{by_slot}", batch_tokens=np.array([1, 1024]), step_ms=np.array([5.0, 1200.0]),
        emit_per_token_ms=0.01, passes_by_slot=by_slot, max_running=max_running,
    )  # fmt: skip


def _busy(run) -> float:
    return float(run.steps["duration_s"].sum())


KW = {"serving": "v2", "record_tokens": False}


def test_one_request_is_one_pass_however_many_drafts_it_verifies():
    """At one request in flight every step is one pass at the request's tokens: the run is
    the one-pass run to the bit."""
    tr = iid_trace(6, 60, gamma=4, alpha=0.8, seed=1)
    a, b = (replay(tr, "static:4", profile=_cost(p, 8), concurrency=1, requests=6, seed=2, **KW)
            for p in (0, 1))  # fmt: skip
    assert (b.steps["duration_s"] > 0).all() and _busy(b) == _busy(a)


def test_requests_take_the_lowest_free_slots_and_uneven_drafts_cut_a_step():
    """Plain decoding (``ar``) keeps three requests in the lowest free slots, consecutive
    however they come and go: every step is one pass, the one-pass run to the bit. With
    drafts (``static:4`` on a trace whose acceptance ends requests unevenly) each step is cut
    where the decoders' verified tokens differ, so it pays more than one pass over the same
    tokens: at most (R - 1) x (the 5 ms first token - a token's price) more a step."""
    tr = iid_trace(24, 40, gamma=4, alpha=0.7, seed=3)
    kw = {"concurrency": 3, "requests": 24, "seed": 5, **KW}
    one, cut = (replay(tr, "ar", profile=_cost(p, 8), **kw) for p in (0, 1))
    assert _busy(cut) == _busy(one)
    one, cut = (replay(tr, "static:4", profile=_cost(p, 8), **kw) for p in (0, 1))
    per_token = (1200.0 - 5.0) / 1023 * 1e-3
    extra = _busy(cut) - _busy(one)
    dec = cut.steps["decoding"]
    assert 0 < extra <= float((dec - 1).clip(lower=0).sum()) * (5e-3 - per_token) + 1e-9


def test_the_flag_survives_the_profile_csv_and_the_bound_refuses_it(tmp_path):
    from specsim.analysis.bound import step_cost
    from specsim.sim.cost.profile_csv import read_profile_csv, write_profile_csv

    back = read_profile_csv(write_profile_csv(_cost(1, 8), tmp_path / "p.csv"))
    assert back.passes_by_slot == 1 and back.has_engine_terms
    with pytest.raises(SpecsimError, match="passes_by_slot"):
        step_cost(back, 2, 4, np.array([100, 100]))
    with pytest.raises(SpecsimError, match="passes_by_slot = 2"):
        _cost(2, 8)


def _pass_ms(n: int) -> float:
    return 3.0 + 1.2 * n if n <= 4 else 7.8 + 0.6 * (n - 4)  # concave, as the CPU's is


def _steps(rng: np.random.Generator) -> pd.DataFrame:
    """Synthetic server-clock steps: 1-6 decoders in random slots of 8, n-gram drafts of
    0-3, each pass costing ``_pass_ms`` of its tokens, 0.2 ms per emitted token, 2% noise."""
    rows = []
    for _ in range(1500):
        r = int(rng.integers(1, 7))
        slots = rng.choice(8, size=r, replace=False)
        tok = 1 + rng.integers(0, 4, size=r)
        sizes = ubatch_sizes(slots.tolist(), tok.tolist())
        ms = (sum(_pass_ms(n) for n in sizes) + 0.2 * r) * (1 + 0.02 * rng.standard_normal())
        rows.append({"duration_s": ms / 1e3, "decoding": r, "batch_tokens": int(tok.sum()),
                     "emitted": r, "prefill_tokens": 0, "ctx_mean": 200.0, "temperature": 0.0,
                     "spec": "ngram:3", "passes": pass_text(sizes)})  # fmt: skip
    return pd.DataFrame(rows)


def test_the_fit_reads_the_table_pass_by_pass_and_needs_the_servers_table():
    """Fitted pass by pass, the table comes back at its knots; read at the steps' total tokens
    (the one-pass model) it cannot: a 1-token pass costs 3 ms of its own."""
    from specsim.fidelity.llama.profile import fit_steps

    steps = _steps(np.random.default_rng(0))
    fit = fit_steps(steps, terms=("passes",))
    assert fit.passes_by_slot
    for k, v in zip(fit.knots, fit.table_ms, strict=True):
        if k <= 8:
            assert v + fit.attn_us * 1e-3 * k * 200 == pytest.approx(_pass_ms(k), rel=0.06), k
    one = fit_steps(steps, terms=())
    assert abs(one.table_ms[0] + one.attn_us * 0.2 - _pass_ms(1)) > 0.5
    with pytest.raises(SpecsimError, match="--step-clock server"):
        fit_steps(steps.drop(columns="passes"), terms=("passes",))


def test_validate_refuses_the_model_on_the_clients_clock():
    from specsim.fidelity.llama.config import LlamaValidationConfig

    with pytest.raises(SpecsimError, match="needs --step-clock server"):
        LlamaValidationConfig(terms=("passes",), step_clock="client")
    assert LlamaValidationConfig(terms=("passes",), step_clock="server").terms == ("passes",)


def test_a_rescore_may_fit_on_fewer_calibration_loads_never_on_unmeasured_ones():
    from specsim.fidelity.llama.config import LlamaValidationConfig
    from specsim.fidelity.llama.profile import calibration_loads

    steps = _steps(np.random.default_rng(1)).assign(concurrency=[1, 2, 6] * 500)
    two = calibration_loads(steps, LlamaValidationConfig(calib_concurrency=(2, 6)))
    assert sorted(set(two["concurrency"])) == [2, 6] and len(two) == 1000
    with pytest.raises(SpecsimError, match="--calib-concurrency 4 was not measured"):
        calibration_loads(steps, LlamaValidationConfig(calib_concurrency=(2, 4)))
