"""The forward passes llama.cpp cuts a server step into (specsim.sim.ubatch), their price in
the simulator, and their term in the llama-server step fit.

Why: llama-server with one KV stream per slot runs one pass per run of consecutive slots
holding as many tokens each (``split_equal(sequential=true)``, llama.cpp b11434); on its
calibration steps a pass costs ~4 ms beyond its tokens, so the same verified tokens cost one
pass or several by which slots verify how many (reports/llama-cpp-v4/PLAN.md, step 4).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from specsim.errors import SpecsimError
from specsim.sim.cost.model import CostModel
from specsim.sim.simulate import replay
from specsim.sim.toy import iid_trace
from specsim.sim.ubatch import ubatch_count, ubatch_sizes


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
    assert sum(sizes) == sum(tokens) and ubatch_count(slots, tokens) == len(sizes)


def _cost(w: float, max_running: int) -> CostModel:
    return CostModel(
        name=f"u{w}", batch_tokens=np.array([1, 1024]), step_ms=np.array([5.0, 1200.0]),
        emit_per_token_ms=0.01, verify_per_ubatch_ms=w, max_running=max_running,
    )  # fmt: skip


def _busy(run) -> float:
    return float(run.steps["duration_s"].sum())


def test_one_request_pays_one_pass_a_step_however_many_drafts_it_verifies():
    """At one request in flight every step with a decoder is one pass: the runs with and
    without the term differ by exactly the term times the decode steps."""
    tr = iid_trace(6, 60, gamma=4, alpha=0.8, seed=1)
    kw = {"concurrency": 1, "requests": 6, "seed": 2, "serving": "v2", "record_tokens": False}
    a, b = (replay(tr, "static:4", profile=_cost(w, 8), **kw) for w in (0.0, 3.0))
    steps = int((b.steps["decoding"] > 0).sum())
    assert steps > 0 and _busy(b) - _busy(a) == pytest.approx(3e-3 * steps, rel=1e-9)


def test_scattered_slots_cost_more_passes_than_a_full_server_and_the_seed_fixes_them():
    """Three requests on a server of three slots always sit in consecutive slots: at one token
    each (``ar``) every step is one pass. On a server of eight slots they are placed at random
    (seeded): some steps take two or three passes, never more than three, and the same seed
    gives the same run."""
    tr = iid_trace(24, 40, gamma=4, alpha=0.7, seed=3)
    kw = {"concurrency": 3, "requests": 24, "seed": 5, "serving": "v2", "record_tokens": False}
    full = [replay(tr, "ar", profile=_cost(w, 3), **kw) for w in (0.0, 4.0)]
    dec = int((full[1].steps["decoding"] > 0).sum())
    assert _busy(full[1]) - _busy(full[0]) == pytest.approx(4e-3 * dec, rel=1e-9)
    wide = [replay(tr, "ar", profile=_cost(w, 8), **kw) for w in (0.0, 4.0)]
    passes = (_busy(wide[1]) - _busy(wide[0])) / 4e-3
    n_dec = wide[1].steps["decoding"]
    assert int((n_dec > 0).sum()) < passes <= float(n_dec.sum()) + 1e-6
    again = replay(tr, "ar", profile=_cost(4.0, 8), **kw)
    assert _busy(again) == _busy(wide[1])


def test_the_term_survives_the_profile_csv_and_the_bound_refuses_it(tmp_path):
    from specsim.analysis.bound import step_cost
    from specsim.sim.cost.profile_csv import read_profile_csv, write_profile_csv

    back = read_profile_csv(write_profile_csv(_cost(2.5, 8), tmp_path / "u.csv"))
    assert back.verify_per_ubatch_ms == 2.5 and back.has_engine_terms
    with pytest.raises(SpecsimError, match="verify_per_ubatch_ms"):
        step_cost(back, 2, 4, np.array([100, 100]))


def _steps(rng: np.random.Generator, w: float) -> pd.DataFrame:
    """Synthetic server-clock steps: 1-6 decoders in random slots of 8, n-gram drafts of
    0-3, durations t(B) + w x passes + 0.2 ms per emitted token, 2% noise."""
    rows = []
    for _ in range(1500):
        r = int(rng.integers(1, 7))
        slots = rng.choice(8, size=r, replace=False)
        tok = 1 + rng.integers(0, 4, size=r)
        b = int(tok.sum())
        u = ubatch_count(slots.tolist(), tok.tolist())
        ms = (2.0 + 1.1 * b + w * u + 0.2 * r) * (1 + 0.02 * rng.standard_normal())
        rows.append({"duration_s": ms / 1e3, "decoding": r, "batch_tokens": b, "emitted": r,
                     "prefill_tokens": 0, "ctx_mean": 200.0, "temperature": 0.0,
                     "spec": "ngram:3", "ubatches": u})  # fmt: skip
    return pd.DataFrame(rows)


def test_the_fit_finds_the_pass_cost_and_needs_the_servers_table():
    from specsim.fidelity.llama.profile import fit_steps

    steps = _steps(np.random.default_rng(0), 4.4)
    fit = fit_steps(steps, terms=("ubatch",))
    assert fit.ubatch_ms == pytest.approx(4.4, rel=0.05)
    with pytest.raises(SpecsimError, match="--step-clock server"):
        fit_steps(steps.drop(columns="ubatches"), terms=("ubatch",))


def test_validate_refuses_the_term_on_the_clients_clock():
    from specsim.fidelity.llama.config import LlamaValidationConfig

    with pytest.raises(SpecsimError, match="needs --step-clock server"):
        LlamaValidationConfig(terms=("ubatch",), step_clock="client")
    assert LlamaValidationConfig(terms=("ubatch",), step_clock="server").terms == ("ubatch",)
