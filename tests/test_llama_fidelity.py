"""``specsim validate --engine llama-server`` (specsim.fidelity.llama): its settings and flags,
the scoring (rankings, goals, pooled acceptance), the profile fit's sign rule, and, slow, one
tiny grid end to end against a real llama-server."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from specsim.cli import main
from specsim.errors import SpecsimError
from specsim.fidelity.llama.config import LlamaValidationConfig, SpecSetting
from specsim.fidelity.llama.grid import rankings
from specsim.fidelity.llama.profile import fit_steps
from specsim.fidelity.llama.report import accept_pooled, goals


@pytest.mark.parametrize(
    "text,kind,n_max", [("none", "none", 0), ("ngram:3", "ngram", 3), (" ngram:7 ", "ngram", 7)]
)
def test_settings_parse(text, kind, n_max):
    s = SpecSetting.parse(text)
    assert (s.kind, s.n_max) == (kind, n_max)
    assert SpecSetting.parse(s.name) == s
    assert ":" not in s.slug


@pytest.mark.parametrize("text", ["ngram", "ngram:x", "none:1", "eagle:3", ""])
def test_bad_settings_are_refused_in_one_line(text):
    with pytest.raises(SpecsimError, match="unknown speculative setting"):
        SpecSetting.parse(text)


def test_dspark_is_refused_with_the_reason():
    with pytest.raises(SpecsimError, match="draft-dspark settings are not in this grid"):
        SpecSetting.parse("dspark:4")


@pytest.mark.parametrize(
    "change,match",
    [
        ({"specs": ("ngram:1",), "ngram_n": 2}, "never drafts"),
        ({"concurrency": (1, 32)}, "concurrency levels"),
        ({"rates": (0.0,)}, "--rates"),
        ({"max_tokens": 8}, "--max-tokens"),
        ({"repeats": 0}, "--repeats"),
    ],
)
def test_config_refuses_bad_grids(change, match):
    with pytest.raises(SpecsimError, match=match):
        LlamaValidationConfig(**change)


def test_cli_bad_setting_exits_2_in_one_line(capsys):
    assert main(["validate", "--engine", "llama-server", "--specs", "none,dspark:3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "draft-dspark" in err


def _cells(real: list[float], sim: list[float], spread: float) -> pd.DataFrame:
    n = len(real)
    return pd.DataFrame(
        {
            "spec": [f"s{i}" for i in range(n)],
            "temperature": 0.0,
            "concurrency": 4,
            "rate": np.nan,
            "real_throughput_tok_s": real,
            "sim_throughput_tok_s": sim,
            "spread_real": spread,
        }
    )


def test_rankings_count_only_pairs_beyond_the_spread():
    # s0 vs s1: 100 vs 103, inside a 5% spread: not counted; s2 (150) is beyond both
    t = _cells([100.0, 103.0, 150.0], [110.0, 100.0, 140.0], 0.05)
    r = rankings(t).iloc[0]
    assert (r["pairs_beyond_spread"], r["pairs_agree"]) == (2, 2)
    assert r["real_order"] == "s2 > s1 > s0" and r["sim_order"] == "s2 > s0 > s1"
    t = _cells([100.0, 150.0], [160.0, 140.0], 0.01)  # the simulator ranks them the other way
    r = rankings(t).iloc[0]
    assert (r["pairs_beyond_spread"], r["pairs_agree"]) == (1, 0)


def test_goals_and_pooled_acceptance():
    t = pd.DataFrame(
        {
            "spec": ["none", "ngram:3", "ngram:3"],
            "temperature": [0.0, 0.0, 0.0],
            "err_throughput_wall": [0.02, -0.04, 0.12],
            "err_tpot_mean_wall": [-0.01, 0.03, 0.05],
            "real_accept_per_draft": [np.nan, 0.5, 0.4],
            "sim_accept_per_draft": [np.nan, 0.55, 0.4],
            "real_drafted": [0, 100, 300],
            "real_accepted": [0, 50, 120],
            "sim_drafted": [0, 100, 300],
            "sim_accepted": [0, 55, 120],
        }
    )
    g = goals(t)
    assert g["throughput_median_abs"] == pytest.approx(0.04)
    assert g["throughput_max_abs"] == pytest.approx(0.12)
    assert g["throughput_within_10"] == pytest.approx(2 / 3)
    assert g["accept_gap_max"] == pytest.approx(0.10)
    p = accept_pooled(t)
    assert len(p) == 1  # `none` drafts nothing: no rate to compare
    assert p["real"].iloc[0] == pytest.approx(170 / 400)
    assert p["gap"].iloc[0] == pytest.approx(175 / 170 - 1)


def test_fit_drops_a_term_that_comes_out_negative():
    """Steps whose prompt tokens cost nothing, with noise: the prefill coefficient is never a
    saving (it would make the simulator's prefill steps cheaper than a decode)."""
    rng = np.random.default_rng(1)
    n = 400
    b = rng.integers(1, 17, size=n)
    p = np.where(rng.random(n) < 0.2, rng.integers(50, 200, size=n), 0)
    e = np.minimum(b, rng.integers(1, 4, size=n) * (b > 0))
    dur = 5.0 + 9.0 * b + 0.6 * e - 0.002 * p + rng.normal(0, 0.5, size=n)
    frame = pd.DataFrame(
        {
            "batch_tokens": b,
            "decoding": b,
            "ctx_mean": rng.uniform(50, 500, size=n),
            "prefill_tokens": p,
            "emitted": e,
            "temperature": 0.0,
            "duration_s": dur / 1000.0,
        }
    )
    fit = fit_steps(frame)
    assert fit.prefill_token_ms == 0.0 and fit.attn_us >= 0.0
    assert fit.emit_ms[0.0] > 0.0
    np.testing.assert_allclose(np.diff(fit.table_ms[:4]), 9.0 * np.diff(fit.knots[:4]), rtol=0.1)


@pytest.mark.slow
def test_a_tiny_grid_runs_end_to_end_against_llama_server(tmp_path):
    """One closed loop and one Poisson rate, no drafting and ngram:3, T = 0, one repeat (about
    a minute): every report file, the issue's columns, and the n-gram reconstruction exact on
    the calibration requests (the steps the profile is fitted on are the server's)."""
    from specsim.serve.llama_server import find_llama_server

    try:
        find_llama_server()
        from specsim.record.models import smollm2_gguf

        smollm2_gguf()
    except SpecsimError as exc:
        pytest.skip(f"needs llama-server and the SmolLM2 GGUF: {exc}")
    out = tmp_path / "llama"
    argv = ["validate", "--engine", "llama-server", "--prompts", "mt-bench[0:4]",
            "--specs", "none,ngram:3", "--concurrency", "2", "--rates", "2", "--repeats", "1",
            "--temperatures", "0", "--min-requests", "4", "--open-requests", "4",
            "--max-tokens", "24", "--calib-prompts", "chat-train[0:6]",
            "--calib-concurrency", "3", "--calib-requests", "1", "--parallel", "4",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    for name in ("README.md", "fidelity.png", "runs.csv", "profile-t0.csv", "config.json"):
        assert (out / name).stat().st_size > 0, name
    table = pd.read_csv(out / "fidelity.csv")
    issue_cols = ["spec", "concurrency", "rate", "temperature", "real_throughput_tok_s",
                  "sim_throughput_tok_s", "err_throughput_wall", "real_tpot_ms_mean",
                  "sim_tpot_ms_mean", "err_tpot_mean_wall", "spread_real"]  # fmt: skip
    assert set(issue_cols) <= set(table.columns) and len(table) == 4
    assert np.isfinite(table[["sim_throughput_tok_s", "real_throughput_tok_s"]]).all().all()
    calib = pd.read_csv(out / "calibration.csv")
    ng = calib[calib["spec"] == "ngram:3"]
    assert (ng["requests_exact"] == ng["requests_checked"]).all() and ng["requests_checked"].sum()
    assert json.loads((out / "grid_time.json").read_text())["minutes"] > 0
    assert main(argv) == 2  # an existing report is not replaced without --force
    assert main([*argv, "--rescore"]) == 0  # scoring again needs no server
