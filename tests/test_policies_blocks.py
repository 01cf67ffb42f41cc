"""The public building blocks (specsim.policies.blocks): worked cases, agreement with the
built-ins they serve, and the docs' plug-in, loaded as a user loads it, deciding exactly what
``vllm-adaptive`` decides.

Worked by hand, two requests, block 3, survivals r0 (0.9, 0.72, 0.36), r1 (0.6, 0.3, 0.15),
ranked 0.9, 0.72, 0.6, 0.36, 0.3, 0.15, step 10 ms + 1 ms per token:

- Theta(B) = (2 + sum of the B best) / (step(2 + B)): 2/12, 2.9/13, 3.62/14, 4.22/15, 4.58/16,
  4.88/17, 5.03/18 = 0.1667, 0.2231, 0.2586, 0.2813, 0.2863, 0.2871, 0.2794: budget 5.
- With 100 ms of drafting in every denominator: 2/112, ..., 4.88/117 = 0.04171, 5.03/118 =
  0.04263: budget 6 (a fixed cost amortised over every verified token: verify them all).
"""

from __future__ import annotations

import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from specsim.lossless.oracle import TOLERANCE, output_law
from specsim.policies import get_policy
from specsim.policies.base import StepInput, TableStepTime
from specsim.policies.blocks import (
    budget_search,
    draft_seconds,
    lagged_survival,
    ranked_values,
    survival,
    throughput_by_budget,
    top_k_lengths,
)
from specsim.policies.hw_aware import _global_budget_flat, zos_lengths

SURV = np.array([[0.9, 0.72, 0.36], [0.6, 0.3, 0.15]])
CONF = np.array([[0.9, 0.8, 0.5], [0.6, 0.5, 0.5]])  # cumprod = SURV


def _linear(b):
    return (10.0 + np.asarray(b, dtype=np.float64)) / 1000.0


def test_survival_and_ranking_by_hand():
    np.testing.assert_allclose(survival(CONF).reshape(2, 3), SURV)
    given_ = np.cumprod(CONF, axis=1)
    assert survival(CONF, given_) is not None and np.shares_memory(survival(CONF, given_), given_)
    np.testing.assert_allclose(ranked_values(SURV), [0.9, 0.72, 0.6, 0.36, 0.3, 0.15])


def test_budget_search_by_hand():
    theta = throughput_by_budget(ranked_values(SURV), _linear, base=2.0, start=2)
    want = np.array([2, 2.9, 3.62, 4.22, 4.58, 4.88, 5.03]) / (np.arange(12, 19) / 1000)
    np.testing.assert_allclose(theta, want)
    assert budget_search(SURV, 2, _linear) == 5
    assert budget_search(SURV, 2, _linear, draft_s=0.100) == 6


def test_budget_search_is_zos_global_search():
    """Without drafting it is the global search ``zos`` and ``hw-aware-global`` run."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        r, g = int(rng.integers(1, 9)), int(rng.integers(1, 8))
        surv = np.cumprod(rng.random((r, g)), axis=1).ravel()
        ms = np.maximum.accumulate(rng.uniform(1, 50, r * g + r + 2))
        fn = lambda b, ms=ms: ms[np.minimum(np.asarray(b), len(ms) - 1)] / 1000  # noqa: E731
        assert budget_search(surv, r, fn) == _global_budget_flat(surv, r, fn)


def test_top_k_lengths_tie_orders():
    """Candidates (0.5, 0.5) and (0.5, 0.05), k = 2: three tie at 0.5. (request, position) order
    takes r0's two: (2, 0); (position, request) takes position 1 of each: (1, 1)."""
    surv = np.array([[0.5, 0.5], [0.5, 0.05]])
    assert top_k_lengths(surv, 2, 2, 2).tolist() == [2, 0]
    assert top_k_lengths(surv, 2, 2, 2, ties="position").tolist() == [1, 1]
    for k in range(5):  # both are prefix-closed and hand out exactly min(k, 4)
        for ties in ("request", "position"):
            assert top_k_lengths(surv, k, 2, 2, ties=ties).sum() == min(k, 4)


def test_top_k_orders_agree_without_ties():
    rng = np.random.default_rng(3)
    for _ in range(100):
        r, g = int(rng.integers(1, 6)), int(rng.integers(1, 6))
        surv = np.cumprod(rng.random((r, g)), axis=1)
        k = int(rng.integers(0, r * g + 2))
        a = top_k_lengths(surv, k, r, g)
        np.testing.assert_array_equal(a, top_k_lengths(surv, k, r, g, ties="position"))


def test_lagged_survival_seeds_new_requests():
    inp = StepInput(
        conf=np.full((2, 3), 0.5), step_time=_linear, lagged_conf=CONF,
        lag_known=np.array([True, False]),
    )  # fmt: skip
    np.testing.assert_allclose(lagged_survival(inp).reshape(2, 3), [SURV[0], [1, 1, 1]])
    np.testing.assert_allclose(lagged_survival(inp, unknown=None).reshape(2, 3), SURV)
    np.testing.assert_allclose(lagged_survival(inp, unknown=0.0).reshape(2, 3)[1], 0.0)
    no_lag = StepInput(conf=CONF, step_time=_linear)
    np.testing.assert_allclose(lagged_survival(no_lag).reshape(2, 3), SURV)  # current rows
    assert draft_seconds(no_lag) == 0.0
    priced = StepInput(conf=CONF, step_time=_linear, draft_time=lambda k: 0.002 * k)
    assert draft_seconds(priced) == pytest.approx(0.006) and draft_seconds(priced, 1) == 0.002


# ---------------------------------------------------------------- the docs' plug-in
@pytest.fixture
def plugin(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent.parent / "examples" / "policies"))
    return get_policy("vllm_adaptive_plugin:policy")


def _random_step(rng: np.random.Generator) -> StepInput:
    r, g = int(rng.integers(0, 12)), int(rng.integers(1, 8))
    conf = rng.random((r, g))
    conf[rng.random((r, g)) < 0.1] = 1.0  # ties
    lagged = rng.random((r, g))
    known = rng.random(r) < 0.8
    ms = np.maximum.accumulate(rng.uniform(1, 30, 4 * (g + 1) * 12 + 4))
    fn = lambda b, ms=ms: ms[np.minimum(np.asarray(b), len(ms) - 1)] / 1000  # noqa: E731
    step_time = TableStepTime(fn, ms / 1000, shift=int(rng.integers(0, 3))) if r % 2 else fn
    d = float(rng.uniform(0, 0.02))
    return StepInput(
        conf=conf, step_time=step_time, lagged_conf=lagged, lag_known=known,
        survival=np.cumprod(conf, axis=1), lagged_survival=np.cumprod(lagged, axis=1),
        draft_time=(lambda k, d=d: d * k / g) if rng.random() < 0.7 else None,
    )  # fmt: skip


def test_plugin_is_short_and_uses_public_blocks_only():
    src = Path(__file__).parent.parent / "examples" / "policies" / "vllm_adaptive_plugin.py"
    code = [ln for ln in src.read_text().split('"""', 2)[2].splitlines() if ln.strip()]
    assert len(code) < 30
    assert "hw_aware" not in src.read_text() and "engines" not in src.read_text()


def test_plugin_equals_vllm_adaptive_on_random_steps(plugin):
    builtin = get_policy("vllm-adaptive")
    assert plugin.needs == builtin.needs and plugin.zos == builtin.zos
    rng = np.random.default_rng(20261204)
    for _ in range(400):
        inp = _random_step(rng)
        np.testing.assert_array_equal(plugin(inp), builtin(inp))


@pytest.mark.parametrize("kv", ["paged", "reserve"])
def test_plugin_replays_like_vllm_adaptive(plugin, kv):
    """The whole run, to the bit, on a shipped trace."""
    from specsim.sim.simulate import replay

    trace = Path(__file__).parent.parent / "traces" / "code.parquet"
    opts = dict(concurrency=8, requests=30, profile="vllm-v4-flash-tp4-b300", kv=kv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = replay(trace, "vllm_adaptive_plugin:policy", **opts).summary
        b = replay(trace, "vllm-adaptive", **opts).summary
    drop = {"wall_time_s", "sim_tokens_per_wall_s"}
    assert {k: v for k, v in a.items() if k not in drop} == pytest.approx(
        {k: v for k, v in b.items() if k not in drop}, rel=0, abs=0, nan_ok=True
    )


def test_docs_plugin_block_is_the_example_file():
    """docs/policies.md shows the plug-in's schedule; it must be the shipped file's."""
    root = Path(__file__).parent.parent
    doc = (root / "docs" / "policies.md").read_text()
    body = (root / "examples" / "policies" / "vllm_adaptive_plugin.py").read_text()
    start = body.index("def schedule")
    schedule_src = body[start : body.index("\n\n\n", start)]
    assert textwrap.dedent(schedule_src) in doc


# ---------------------------------------------------------------- losslessness of the new rules
NEW_RULES = [
    "trtllm-confidence", "trtllm-confidence:0:2", "trtllm-schedule:1=3,2=1",
    "sglang-dspark", "sglang-dspark:1",
]  # fmt: skip

EXACT = settings(
    derandomize=True, database=None, deadline=None, max_examples=25,
    suppress_health_check=[HealthCheck.too_slow],
)  # fmt: skip


from test_lossless_exact import worlds  # noqa: E402  (one generator of worlds)


@pytest.mark.slow  # fast suite under 5 min: over 2.8 s alone (CI runs it)
@EXACT
@given(worlds(), st.sampled_from(NEW_RULES))
def test_new_engine_rules_are_lossless(world, policy):
    """The exact check the other built-ins pass (test_lossless_exact.py): the enumerated output
    law of the study request equals the target's."""
    toy, gamma, m, batch = world
    res = output_law(toy, m, gamma, policy, batch=batch)
    assert res.tv <= TOLERANCE, (policy, res.worst())


conf_arrays = st.integers(1, 8).flatmap(
    lambda r: st.integers(1, 6).flatmap(
        lambda g: hnp.arrays(np.float64, (r, g), elements=st.floats(0.0, 1.0))
    )
)


@settings(max_examples=60, deadline=None)
@given(conf=conf_arrays, data=st.data())
def test_new_engine_rules_do_not_anticipate(conf, data):
    """Perturbing c_{r,k+1..} never changes {l_r >= k} (the property lossless rests on)."""
    r = data.draw(st.integers(0, conf.shape[0] - 1))
    k = data.draw(st.integers(1, conf.shape[1]))
    tail = data.draw(hnp.arrays(np.float64, conf.shape[1] - k, elements=st.floats(0.0, 1.0)))
    other = conf.copy()
    other[r, k:] = tail
    lagged = np.full_like(conf, 0.6)
    for name in NEW_RULES:
        a = get_policy(name)(StepInput(conf=conf, step_time=_linear, lagged_conf=lagged))
        b = get_policy(name)(StepInput(conf=other, step_time=_linear, lagged_conf=lagged))
        assert (a[r] >= k) == (b[r] >= k), name


def test_zos_budget_is_the_block_budget():
    """``zos`` is budget_search on lagged rows then the live top-K: the blocks rebuild it."""
    rng = np.random.default_rng(11)
    for _ in range(100):
        inp = _random_step(rng)
        if inp.n_requests == 0:
            continue
        inp = StepInput(conf=inp.conf, step_time=inp.step_time, lagged_conf=inp.lagged_conf)
        r, g = inp.conf.shape
        budget = budget_search(lagged_survival(inp, unknown=None), r, inp.step_time)
        mine = top_k_lengths(survival(inp.conf), budget, r, g)
        np.testing.assert_array_equal(mine, zos_lengths(inp))
