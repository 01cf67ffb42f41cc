"""The G-test: cell merging, false-positive control, power, zero-probability hits, and the
statistical check of the real samplers (same-vs-same passes, a lossy mutant fails)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from specsim.lossless.check import stat_worlds, statistical_check
from specsim.lossless.mutants import by_name
from specsim.lossless.pipeline import Pipeline
from specsim.lossless.stats import ALPHA, MIN_EXPECTED, detectable_tv, g_test, merge_cells


@settings(derandomize=True, database=None, deadline=None, max_examples=60)
@given(st.lists(st.floats(0.001, 50.0), min_size=2, max_size=40), st.integers(0, 2**31 - 1))
def test_merged_cells_all_reach_the_bar_and_keep_totals(expected, seed):
    e = np.asarray(expected)
    c = np.random.default_rng(seed).poisson(e).astype(float)
    mc, me = merge_cells(c, e)
    assert mc.sum() == c.sum() and np.isclose(me.sum(), e.sum())
    if e.sum() >= MIN_EXPECTED:
        assert me.min() >= MIN_EXPECTED
    else:
        assert me.shape == (1,)


def test_detectable_tv_matches_the_sample_size_table():
    # losslessness.md: 8 cells, TV 0.02 needs ~43k samples; 64 cells, TV 0.05 needs ~12k.
    assert 0.018 < detectable_tv(43_000, 7) < 0.022
    assert 0.045 < detectable_tv(12_000, 63) < 0.056
    assert detectable_tv(400_000, 26) < detectable_tv(100_000, 26)


def test_null_draws_never_reject_at_alpha():
    """500 same-vs-same tests at alpha 1e-6: P(any rejection) < 1e-3."""
    rng = np.random.default_rng(20261129)
    probs = rng.dirichlet(np.ones(30))
    probs[:3] = [1e-5, 2e-5, 0.0]
    probs /= probs.sum()
    p_values = [g_test(rng.multinomial(50_000, probs), probs).p_value for _ in range(500)]
    assert min(p_values) > ALPHA
    # Calibration: about 10% of p-values below 0.1 (binomial(500, 0.1): 6 sigma = 40).
    assert abs(np.mean(np.asarray(p_values) < 0.1) - 0.1) < 0.08


def test_power_at_the_detectable_tv():
    """The least favourable alternative at the reported TV is rejected (99% nominal power)."""
    n, cells = 60_000, 16
    probs = np.full(cells, 1.0 / cells)
    tv = detectable_tv(n, cells - 1)
    alt = probs.copy()
    alt[: cells // 2] += 2 * tv / cells  # moves mass tv from one half to the other
    alt[cells // 2 :] -= 2 * tv / cells
    rng = np.random.default_rng(7)
    rejected = [not g_test(rng.multinomial(n, alt), probs).passed for _ in range(60)]
    assert sum(rejected) >= 54  # binomial(60, 0.99): P(< 54) ~ 1e-6


def test_a_sample_on_a_zero_probability_cell_fails_at_once():
    probs = np.array([0.5, 0.5, 0.0])
    g = g_test(np.array([49_990, 50_009, 1]), probs)
    assert g.zero_hits == 1 and g.p_value == 0.0 and not g.passed


def test_reference_sampler_passes_and_recovered_from_p_fails():
    world = stat_worlds(0)[2]  # V3-g2-batch3-jagged
    ok = statistical_check(Pipeline(name="rejection + hw-aware", scheduler="hw-aware"),
                           world, 100_000, seed=3)  # fmt: skip
    assert ok["lossless"] and ok["p_value"] > ALPHA
    assert 0 < ok["detectable_tv"] < 0.03
    bad = statistical_check(by_name("recovered-from-p").pipeline, world, 100_000, seed=3)
    assert not bad["lossless"] and bad["p_value"] < ALPHA


def test_same_seed_same_result_bit_for_bit():
    world = stat_worlds(0)[4]  # V2-g3-ties-batch4
    pipe = Pipeline(name="rejection + zos", scheduler="zos")
    a = statistical_check(pipe, world, 20_000, seed=11)
    b = statistical_check(pipe, world, 20_000, seed=11)
    assert a == b
