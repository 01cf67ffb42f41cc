"""Synthetic traces: profile, calibration and AUROC hit their targets within sampling error.

Each statistical check uses a fixed seed and alpha = 1e-6 (|z| < 4.89), and each comes with a
mutant (a trace generated with a wrong parameter) that the same check must reject.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
from compare import assert_arrays_close, meta_diff
from scipy.stats import norm

from specsim.cli import main
from specsim.errors import SpecsimError
from specsim.trace.io import load_meta, read_trace, write_trace
from specsim.trace.stats import ECE_BINS, auroc, conditional_samples, ece, per_position_table
from specsim.trace.synth import (
    PROFILES,
    auroc_for,
    concentration_for,
    fit_profile,
    profile_tau,
    synth_trace,
)

ALPHA = 1e-6
Z = float(norm.isf(ALPHA / 2))  # 4.89
ROOT = Path(__file__).resolve().parents[1]
N_REQ = 300


def profile_z(trace, profile) -> float:
    """Largest |z| of the per-position conditional acceptance against the profile (binomial SE)."""
    t = per_position_table(trace)
    m = np.asarray(profile)
    z = (t["accept_rate"].to_numpy() - m) / np.sqrt(m * (1 - m) / t["n"].to_numpy())
    return float(np.abs(z).max())


def calibration_z(trace) -> tuple[float, float]:
    """Per-bin calibration test: (largest |z| over bins, the ECE bound those z's imply).

    Under calibration the successes in a bin have mean sum(c) and variance sum(c (1 - c))
    (independent Bernoullis); bins with variance < 25 are too small for the normal law.
    """
    score, label, _ = conditional_samples(trace)
    score = score.astype(np.float64)
    b = np.minimum((score * ECE_BINS).astype(int), ECE_BINS - 1)
    s = np.bincount(b, score, ECE_BINS)
    y = np.bincount(b, label.astype(float), ECE_BINS)
    var = np.bincount(b, score * (1 - score), ECE_BINS)
    big = var >= 25
    z = np.abs(y - s)[big] / np.sqrt(var[big])
    return float(z.max()), float(Z * np.sqrt(var).sum() / score.size)


def auroc_z(trace, expected: float) -> float:
    """|AUROC - expected| in Hanley-McNeil standard errors."""
    score, label, _ = conditional_samples(trace)
    a = auroc(score, label)
    n1, n0 = int(label.sum()), int((~label).sum())
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    se = np.sqrt((a * (1 - a) + (n1 - 1) * (q1 - a * a) + (n0 - 1) * (q2 - a * a)) / (n1 * n0))
    return abs(a - expected) / se


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PROFILES))
def test_profile_hit_within_binomial_error(name):
    profile = PROFILES[name]
    trace = synth_trace(n_requests=N_REQ, accept_profile=profile, seed=10)
    assert profile_z(trace, profile) < Z
    # Mutant: every conditional rate 0.02 higher; the same check must reject it.
    mutant = synth_trace(n_requests=N_REQ, accept_profile=[p + 0.02 for p in profile], seed=10)
    assert profile_z(mutant, profile) > Z


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_confidences_are_calibrated(name):
    trace = synth_trace(n_requests=N_REQ, accept_profile=PROFILES[name], seed=20)
    z, bound = calibration_z(trace)
    assert z < Z
    score, label, _ = conditional_samples(trace)
    assert ece(score, label) < bound
    # Mutants: over- and under-confident by a logit factor; accept_len is untouched by it.
    for factor in (1.3, 0.75):
        bad = synth_trace(
            n_requests=N_REQ, accept_profile=PROFILES[name], seed=20, calibration=factor
        )
        assert np.array_equal(bad.accept_len, trace.accept_len)
        z_bad, _ = calibration_z(bad)
        assert z_bad > Z
        s_bad, l_bad, _ = conditional_samples(bad)
        assert ece(s_bad, l_bad) > bound


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PROFILES))
def test_auroc_near_target(name):
    profile = PROFILES[name]
    kappa = concentration_for(profile, 0.85)
    expected = auroc_for(profile, kappa)
    assert expected == pytest.approx(0.85, abs=1e-6)
    trace = synth_trace(n_requests=N_REQ, accept_profile=profile, seed=30, auroc=0.85)
    assert auroc_z(trace, expected) < Z
    # Mutant: a trace made for AUROC 0.82 fails the check for 0.85.
    mutant = synth_trace(n_requests=N_REQ, accept_profile=profile, seed=30, auroc=0.82)
    assert auroc_z(mutant, expected) > Z


def test_auroc_mapping_is_monotone_and_bounded():
    p = PROFILES["chat"]
    values = [auroc_for(p, k) for k in (0.1, 1.0, 10.0, 100.0)]
    assert all(a > b for a, b in zip(values, values[1:], strict=False))
    with pytest.raises(SpecsimError, match="out of reach"):
        concentration_for(p, 0.52)
    with pytest.raises(SpecsimError, match="strictly inside"):
        synth_trace(n_requests=2, accept_profile=[0.9, 1.0])
    with pytest.raises(SpecsimError, match="'calibrated' or a positive factor"):
        synth_trace(n_requests=2, accept_profile=[0.9], calibration="hot")


def test_profiles_reproduce_published_tau():
    # chat: 1 + (0.78 + 0.55 + 0.37 + 0.24 + 0.16 + 0.11 + 0.08), the survival prior.
    assert profile_tau(PROFILES["chat"]) == pytest.approx(3.29, abs=0.005)
    assert profile_tau(PROFILES["code"]) == pytest.approx((5.52 + 5.16) / 2, abs=0.005)
    assert profile_tau(PROFILES["math"]) == pytest.approx((6.17 + 5.78) / 2, abs=0.005)
    assert fit_profile((0.8, 0.7), 4) == (0.8, 0.7, 0.7, 0.7)
    assert fit_profile(PROFILES["math"], 2) == PROFILES["math"][:2]


def test_same_seed_same_bytes(tmp_path):
    """Same seed, same process, same code path: bit-identity is the point here."""
    kw = dict(n_requests=20, accept_profile=PROFILES["code"], category="code")
    a = write_trace(synth_trace(seed=5, **kw), tmp_path / "a.parquet")
    b = write_trace(synth_trace(seed=5, **kw), tmp_path / "b.parquet")
    c = write_trace(synth_trace(seed=6, **kw), tmp_path / "c.parquet")
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    meta = load_meta(a)
    assert meta["source"] == "synthetic"
    params = json.loads(meta["specsim.synth"])
    assert params["seed"] == 5 and params["accept_profile"] == list(PROFILES["code"])
    assert params["n_requests"] == 20 and params["auroc_target"] == 0.85


def test_cli_synth(tmp_path, capsys):
    out = tmp_path / "s.parquet"
    argv = ["traces", "synth", "--out", str(out), "--profile", "custom", "0.8,0.7"]
    argv += ["--block-size", "4", "--requests", "30", "--auroc", "0.9", "--seed", "3"]
    assert main(argv) == 0
    msg = capsys.readouterr().out
    assert msg.startswith(f"wrote {out}: 30 requests") and "(target 0.9)" in msg
    t = read_trace(out)
    assert t.block_size == 4 and t.n_requests == 30
    assert json.loads(t.meta["specsim.synth"])["accept_profile"] == [0.8, 0.7, 0.7, 0.7]
    assert t.category.tolist() == ["custom"] * 30
    assert main(argv) == 2  # exists, no --force
    assert "pass --force" in capsys.readouterr().err
    bad = ["traces", "synth", "--out", str(tmp_path / "x.parquet"), "--auroc", "0.5"]
    assert main(bad) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "out of reach" in err


def _shipped_commands() -> list[list[str]]:
    text = (ROOT / "traces" / "SYNTHETIC.md").read_text()
    return [shlex.split(line)[1:] for line in re.findall(r"^specsim traces synth .*$", text, re.M)]


def test_shipped_traces_are_what_the_documented_commands_make(tmp_path, capsys):
    commands = _shipped_commands()
    stress = ("bimodal", "decaying", "overconfident", "uninformative")
    assert {c[c.index("--out") + 1] for c in commands} == {
        *(f"traces/synthetic-{n}.parquet" for n in ("chat", "code", "math")),
        *(f"traces/stress-{n}.parquet" for n in stress),
    }
    for argv in commands:
        shipped = ROOT / argv[argv.index("--out") + 1]
        assert shipped.stat().st_size < 1_000_000
        mine = tmp_path / shipped.name
        argv = [str(mine) if a == argv[argv.index("--out") + 1] else a for a in argv]
        assert main(argv) == 0
        a, b = read_trace(shipped), read_trace(mine)
        # made on another machine: ints exact, floats to 1e-9 (tests/compare.py says why)
        for name in ("request_ids", "prompt_len", "output_len", "conf", "accept_len"):
            assert_arrays_close(getattr(a, name), getattr(b, name), f"{shipped}: {name}")
        assert_arrays_close(a.draft_tokens, b.draft_tokens, f"{shipped}: draft_tokens")
        assert a.meta.keys() == b.meta.keys()
        for key in a.meta:
            diff = meta_diff(a.meta[key], b.meta[key])
            assert diff is None, (shipped, key, diff)
        assert a.meta["source"] == "synthetic"
        assert 100 <= a.n_requests <= 300
        assert 100 <= np.median(a.output_len) <= 400
    capsys.readouterr()


def test_stress_shapes():
    """A request-level mixture gives each request one component's rates (bimodal); decay_to
    lowers acceptance along each output."""
    mix = synth_trace(
        n_requests=60, accept_profile=PROFILES["code"], concentration=1e5, seed=4,
        mixture=[(0.5, [0.95] * 7), (0.5, [0.1] * 7)],
    )  # fmt: skip
    first = np.array([mix.conf[o, 0] for o in mix.offsets[:-1]])
    assert set(np.round(first.astype(float), 2).tolist()) == {0.95, 0.1}
    dec = synth_trace(
        n_requests=40, accept_profile=PROFILES["code"], concentration=1e5, seed=4, decay_to=0.3
    )
    lo, hi = int(dec.offsets[0]), int(dec.offsets[1])
    assert dec.conf[lo, 0] == pytest.approx(0.9, abs=0.01)
    assert dec.conf[hi - 1, 0] == pytest.approx(0.27, abs=0.01)
    with pytest.raises(SpecsimError, match="decay_to"):
        synth_trace(n_requests=2, accept_profile=[0.5], decay_to=0.0)
