"""The step model's structural terms of PLAN.md steps 9 and 17: ``no_context`` (no ``B * ctx``
column), ``by_kind`` (the target-only and the draft-model servers fitted apart) and
``monotone`` (a table that never falls, costs never savings), on synthetic server-clock steps
whose true prices are known."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from specsim.errors import SpecsimError
from specsim.fidelity.llama.config import LlamaValidationConfig
from specsim.fidelity.llama.profile import cost_model, fit_kinds, fit_steps
from specsim.sim.ubatch import pass_text


def _pass_ms(n: int) -> float:
    return 4.0 + 0.8 * (n - 1) if n <= 4 else 6.4 + 0.5 * (n - 4)


def _steps(rng: np.random.Generator, spec: str, n: int, extra_ms: float = 0.0) -> pd.DataFrame:
    """One-pass steps of 1-3 decoders (1-2 tokens each) whose price does not depend on their
    context (100-500 tokens): ``extra_ms`` a step on top (a drafter's forward), 0.3 ms an
    emitted token, 1% noise."""
    rows = []
    for _ in range(n):
        dec = int(rng.integers(1, 4))
        tok = int(dec * rng.integers(1, 3))
        ms = (_pass_ms(tok) + extra_ms + 0.3 * dec) * (1 + 0.01 * rng.standard_normal())
        rows.append({"duration_s": ms / 1e3, "decoding": dec, "batch_tokens": tok,
                     "emitted": dec, "prefill_tokens": 0, "ctx_mean": rng.uniform(100, 500),
                     "temperature": 0.0, "spec": spec, "passes": pass_text([tok])})  # fmt: skip
    return pd.DataFrame(rows)


def test_no_context_prices_a_pass_by_the_table_alone():
    """Without the column the fit has no context price, the table comes back at its knots,
    and the profile's two context rows are the same."""
    from specsim.fidelity.llama.profile import design, knots_for

    steps = _steps(np.random.default_rng(0), "ngram:3", 600)
    knots = knots_for(int(steps["batch_tokens"].max()))
    x = design(steps, knots, (0.0,), ("passes", "no_context"))
    assert not x[:, len(knots)].any()
    assert design(steps, knots, (0.0,), ("passes",))[:, len(knots)].all()
    fit = fit_steps(steps, terms=("passes", "no_context"))
    assert fit.attn_us == 0.0
    for k, v in zip(fit.knots, fit.table_ms, strict=True):
        assert v == pytest.approx(_pass_ms(k), rel=0.03), k
    assert fit.emit_ms[0.0] == pytest.approx(0.3, abs=0.05)
    limits = {"max_running": 8, "kv_tokens": 8192, "max_batched_tokens": 2048}
    cm = cost_model(fit, 0.0, "t", limits, {})
    np.testing.assert_allclose(cm.step_ms[0], cm.step_ms[-1])


def test_by_kind_fits_each_server_kind_on_its_own_steps():
    """A draft-model server whose every step costs 5 ms more (its drafter), with twice the
    steps: one shared fit prices the target-only server's steps near the drafter's; by kind,
    each comes back."""
    rng = np.random.default_rng(1)
    steps = pd.concat([_steps(rng, "ngram:3", 300), _steps(rng, "dspark:7", 600, 5.0)],
                      ignore_index=True)  # fmt: skip
    terms = ("passes", "no_context", "by_kind")
    fits = fit_kinds(steps, terms=terms)
    for drafter, extra in ((False, 0.0), (True, 5.0)):
        assert fits[drafter].table_ms[0] == pytest.approx(_pass_ms(1) + extra, rel=0.03)
    shared = fit_kinds(steps, terms=("passes", "no_context"))
    assert shared[False] is shared[True]
    assert shared[False].table_ms[0] > _pass_ms(1) + 2.0  # the plain server priced high
    only = fit_kinds(steps[steps["spec"] == "ngram:3"], terms=terms)
    assert set(only) == {False}  # no draft-model steps: no such fit (score refuses in a line)


def test_the_terms_are_words_of_terms_and_nothing_else_is():
    cfg = LlamaValidationConfig(
        terms=("drafter_request", "passes", "no_context", "by_kind"), step_clock="server"
    )
    assert "no_context" in cfg.terms and "by_kind" in cfg.terms
    with pytest.raises(SpecsimError, match="--terms 'no_ctx' unknown"):
        LlamaValidationConfig(terms=("no_ctx",))


def test_monotone_recovers_a_table_that_rises_as_the_free_fit_does():
    """On steps whose true table rises with B, ``monotone`` changes nothing that matters: the
    table comes back at its knots within 3%, as the free fit's does."""
    steps = _steps(np.random.default_rng(2), "ngram:3", 600)
    for terms in (("passes", "no_context"), ("passes", "no_context", "monotone")):
        fit = fit_steps(steps, terms=terms)
        for k, v in zip(fit.knots, fit.table_ms, strict=True):
            assert v == pytest.approx(_pass_ms(k), rel=0.03), (terms, k)


def test_monotone_never_prices_more_tokens_below_fewer():
    """A few large steps measured cheaper than smaller ones (the calibration's drafted steps at
    C = 6 did so: PLAN.md step 17): freely fitted, the table falls from 8 to 16 tokens; under
    ``monotone`` it never falls and no other coefficient is a saving."""
    rng = np.random.default_rng(3)
    small = _steps(rng, "ngram:3", 400)
    big = small.sample(40, random_state=0).assign(
        batch_tokens=[8, 16] * 20, passes=[pass_text([8]), pass_text([16])] * 20,
        duration_s=[9.0e-3, 6.0e-3] * 20)  # fmt: skip
    steps = pd.concat([small, big], ignore_index=True)
    free = fit_steps(steps, terms=("passes",))
    mono = fit_steps(steps, terms=("passes", "monotone"))
    assert np.any(np.diff(free.table_ms) < -1.0)  # the free fit falls
    assert np.all(np.diff(mono.table_ms) >= -1e-9)
    assert min(mono.attn_us, mono.prefill_token_ms, mono.emit_ms[0.0]) >= 0.0
    assert mono.table_ms[0] == pytest.approx(_pass_ms(1), rel=0.05)
