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


@pytest.mark.parametrize(
    "text,n_max,p_min,name",
    [("dspark:7", 7, 0.0, "dspark:7"), ("dspark:4", 4, 0.0, "dspark:4"),
     (" dspark:7:0.5 ", 7, 0.5, "dspark:7:0.5"), ("dspark:7:0.50", 7, 0.5, "dspark:7:0.5"),
     ("dspark:7:0", 7, 0.0, "dspark:7"), ("dspark:3:-0", 3, 0.0, "dspark:3"),
     ("dspark:2:0.123456789", 2, 0.123456789, "dspark:2:0.123456789")],
)  # fmt: skip
def test_dspark_settings_parse(text, n_max, p_min, name):
    s = SpecSetting.parse(text)
    assert (s.kind, s.n_max, s.p_min, s.name) == ("dspark", n_max, p_min, name)
    assert SpecSetting.parse(s.name) == s  # runs.csv's names parse back to the setting
    assert s.slug == name.replace(":", "-") and ":" not in s.slug
    assert s.policy == SpecSetting.parse("ngram:3").policy == "threshold:0.5"


@pytest.mark.parametrize(
    "text",
    ["ngram", "ngram:x", "none:1", "eagle:3", "", "dspark", "dspark:x", "dspark:7.5",
     "dspark:7:y", "dspark:7:0.5:1", "dspark:"],
)  # fmt: skip
def test_bad_settings_are_refused_in_one_line(text):
    with pytest.raises(SpecsimError, match="unknown speculative setting") as err:
        SpecSetting.parse(text)
    assert "dspark:N[:P]" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "text,match",
    [("dspark:0", "block N of dspark:N must be at least 1"),
     ("dspark:-2", "block N of dspark:N must be at least 1"),
     ("dspark:7:1", r"confidence cut P of dspark:N:P must be in \[0, 1\)"),
     ("dspark:7:1.5", r"must be in \[0, 1\)"), ("dspark:7:-0.1", r"must be in \[0, 1\)"),
     ("dspark:7:nan", r"must be in \[0, 1\)"), ("dspark:7:inf", r"must be in \[0, 1\)")],
)  # fmt: skip
def test_dspark_values_out_of_range_are_refused_naming_the_fix(text, match):
    with pytest.raises(SpecsimError, match=match) as err:
        SpecSetting.parse(text)
    assert text in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "change,match",
    [({"specs": ("none", "dspark:8")}, r"clamps --spec-draft-n-max 8 to 7; give N in \[1, 7\]"),
     ({"specs": ("none", "dspark:7", "dspark:7:0")}, "names dspark:7 twice"),
     ({"specs": ("none", "dspark:4"), "dspark_drafter": "no-such-drafter"},
      "neither a drafter name")],
)  # fmt: skip
def test_config_checks_dspark_settings_against_their_drafter(change, match):
    with pytest.raises(SpecsimError, match=match):
        LlamaValidationConfig(**change)


def test_a_checkpoint_folder_drafter_bounds_the_block_by_its_own(tmp_path):
    """--dspark-drafter FOLDER: its config's block size is the bound, and a confidence cut on a
    drafter without a confidence head is refused (llama-server would not start)."""
    (tmp_path / "config.json").write_text(
        json.dumps({"block_size": 4, "enable_confidence_head": False})
    )
    ok = LlamaValidationConfig(specs=("none", "dspark:4"), dspark_drafter=str(tmp_path))
    assert ok.settings[1].n_max == 4
    with pytest.raises(SpecsimError, match="drafts blocks of 4"):
        LlamaValidationConfig(specs=("none", "dspark:5"), dspark_drafter=str(tmp_path))
    with pytest.raises(SpecsimError, match="no confidence head"):
        LlamaValidationConfig(specs=("none", "dspark:4:0.3"), dspark_drafter=str(tmp_path))


def test_config_takes_dspark_settings_of_the_shipped_drafter_and_serves_them():
    from specsim.fidelity.llama.servers import drafter_folder, server_args
    from specsim.record.draft_gguf import gguf_path

    cfg = LlamaValidationConfig(specs=("none", "dspark:7", "dspark:4", "dspark:7:0.5"))
    assert cfg.dspark_drafter == "dspark-v3"
    folder = drafter_folder(cfg)
    assert folder.name == "dspark-v3-b179c9523d0e"
    from specsim.record.draft_gguf import drafter_dir

    # --drafter's names mean the same here: dspark is v3, dspark-v2 the older one
    assert drafter_dir("dspark") == folder and drafter_dir(folder.name) == folder
    assert drafter_dir("dspark-v2").name == "dspark-b179c9523d0e"
    args = list(server_args(cfg, SpecSetting.parse("dspark:4:0.5")))
    flag = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("-")}
    assert flag["-md"] == str(gguf_path(folder)) and flag["-md"].endswith(".gguf")
    assert gguf_path(folder).parent.name == "drafts" and folder.name in flag["-md"]
    assert flag["--spec-type"] == "draft-dspark"
    assert (flag["--spec-draft-n-max"], flag["--spec-draft-p-min"]) == ("4", "0.5")
    assert (flag["-np"], flag["-t"]) == (str(cfg.parallel), str(cfg.threads))  # the grid's
    plain = server_args(cfg, SpecSetting.parse("dspark:7"))
    assert plain[plain.index("--spec-draft-p-min") + 1] == "0"
    assert "-md" not in server_args(cfg, SpecSetting.parse("none"))


@pytest.mark.parametrize(
    "change,match",
    [
        ({"specs": ("ngram:1",), "ngram_n": 2}, "never drafts"),
        ({"concurrency": (1, 32)}, "concurrency levels"),
        ({"rates": (0.0,)}, "--rates"),
        ({"max_tokens": 8}, "--max-tokens"),
        ({"repeats": 0}, "--repeats"),
        ({"target_type": "Q2_K"}, "--target-type 'Q2_K' unknown; use one of Q4_1"),
        ({"dspark_trace": "gpu"}, "--dspark-trace is 'torch' or 'server'"),
        ({"ngram_trace": "torch"}, "--ngram-trace is 'port' or 'server'"),
        ({"step_clock": "wall"}, "--step-clock is 'client' or 'server'"),
        ({"terms": ("spec_step", "attention")}, "--terms 'attention' unknown; use some of"),
        ({"terms": ("pass_extra",), "step_clock": "server"}, "pass_extra prices each pass"),
        ({"slot_rule": "scattered"}, "--slot-rule is one of lowest, llama-server"),
        ({"arrival_seeds": "random"}, "--arrival-seeds is one of fixed, per-run"),
        ({"slot_rule": "random"}, "add passes to --terms, or leave --slot-rule out"),
        ({"slot_rule": "llama-server"}, "add passes to --terms, or leave --slot-rule out"),
    ],
)
def test_config_refuses_bad_grids(change, match):
    with pytest.raises(SpecsimError, match=match):
        LlamaValidationConfig(**change)


def test_scoring_reads_the_calibration_steps_of_its_clock():
    """One calibration table holds both clocks' steps of the same runs; a table from before the
    clock column is the client's; a clock that timed nothing is refused in one line."""
    import pandas as pd

    from specsim.fidelity.llama.profile import calibration_steps

    both = pd.DataFrame({"duration_s": [0.01, 0.02, 0.03], "clock": ["client", "server", "server"]})
    assert calibration_steps(both, "server")["duration_s"].tolist() == [0.02, 0.03]
    assert "clock" not in calibration_steps(both, "client")
    old = both.drop(columns="clock")
    assert len(calibration_steps(old, "client")) == 3
    with pytest.raises(SpecsimError, match="no 'server' clock's table; measure with --step-clock"):
        calibration_steps(old, "server")


@pytest.mark.parametrize(
    "specs,needle", [("none,dspark:9", "clamps"), ("none,dspark:7:1.5", "dspark:7:1.5"),
                     ("none,dspark:7:high", "dspark:N[:P]"), ("none,eagle:3", "dspark:N[:P]")],
)  # fmt: skip
def test_cli_bad_setting_exits_2_in_one_line(capsys, specs, needle):
    assert main(["validate", "--engine", "llama-server", "--specs", specs]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and needle in err


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
@pytest.mark.real_server
def test_a_tiny_grid_runs_end_to_end_against_llama_server(tmp_path):
    """One closed loop and one Poisson rate, no drafting and ngram:3, T = 0, one repeat (about
    a minute): every report file, the issue's columns, and the n-gram reconstruction exact on
    the calibration requests (the steps the profile is fitted on are the server's)."""
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


@pytest.mark.slow
@pytest.mark.real_server
def test_a_grid_calibrated_on_the_servers_clock(tmp_path):
    """``--step-clock server``: the calibration runs go to a server of their own that logs its
    steps; both clocks' tables of the same runs are kept (the server's emits what the
    requests generated), the raw log becomes a step table, and the same runs score again on
    the client's clock."""
    out = tmp_path / "llama"
    argv = ["validate", "--engine", "llama-server", "--prompts", "copy-edit[0:3]",
            "--specs", "none,ngram:3", "--concurrency", "1", "--rates", "2", "--repeats", "1",
            "--temperatures", "0", "--min-requests", "3", "--open-requests", "3",
            "--max-tokens", "24", "--calib-prompts", "copy-edit[32:35]",
            "--calib-concurrency", "1,2", "--calib-requests", "2", "--parallel", "4",
            "--target-type", "Q4_0-pure", "--step-clock", "server", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    steps = pd.read_parquet(out / "calibration_steps.parquet")
    assert set(steps["clock"]) == {"client", "server"}
    server = steps[steps["clock"] == "server"]
    assert (server["duration_s"] > 0).all() and (server["prefill_tokens"] > 0).any()
    ng = server[server["spec"] == "ngram:3"]
    assert (ng["batch_tokens"] > ng["decoding"]).any()  # it drafted, and the log says so
    emitted = steps.groupby(["clock", "spec", "concurrency"])["emitted"].sum()
    assert (emitted["server"] == emitted["client"]).all()  # every generated token, both ways
    assert (out / "logs" / "steps" / "calibration-ngram-3.parquet").exists()
    assert not list((out / "logs" / "calibration").glob("*.log"))
    argv[argv.index("server")] = "client"
    assert main([*argv, "--rescore"]) == 0


def test_rankings_with_intervals_count_pairs_whose_intervals_do_not_overlap():
    """Issue #48's rule: a pair is judged where the real gap exceeds both medians' intervals;
    a wide spread of the repeats no longer hides a pair the intervals separate."""
    t = _cells([100.0, 103.0, 150.0], [110.0, 100.0, 140.0], 0.50)  # spreads hide every pair
    assert rankings(t).iloc[0]["pairs_beyond_spread"] == 0
    t["real_throughput_tok_s_lo"] = [99.0, 101.5, 148.0]
    t["real_throughput_tok_s_hi"] = [100.5, 104.0, 151.0]  # s0 and s1 apart, both below s2
    r = rankings(t).iloc[0]
    assert (r["pairs_beyond_spread"], r["pairs_agree"], r["pair_rule"]) == (3, 2, "intervals")
    t["real_throughput_tok_s_hi"] = [102.0, 104.0, 151.0]  # s0's interval reaches s1's
    assert rankings(t).iloc[0]["pairs_beyond_spread"] == 2


def test_goal_rows_judge_the_cells_whose_real_interval_is_tight():
    from specsim.fidelity.llama.report_text import goal_rows

    t = pd.DataFrame(
        {
            "spec": ["none", "none", "none"],
            "temperature": [0.0, 0.0, 0.0],
            "err_throughput_wall": [0.02, -0.04, 0.30],  # the 30% cell's interval is wide
            "err_tpot_mean_wall": [-0.01, 0.03, 0.25],
            "real_accept_per_draft": [np.nan] * 3,
            "sim_accept_per_draft": [np.nan] * 3,
            "converged": [True, True, False],
        }
    )
    ranks = pd.DataFrame({"pairs_beyond_spread": [0], "pairs_agree": [0]})
    text = goal_rows(goals(t), ranks, 10.0, ((0.1,), (0.2,)), 75.0)
    row = next(r for r in text.splitlines() if "every such cell's throughput" in r)
    assert "worst 4.0%" in row and row.endswith("| met |"), text
    assert "the 2 of 3 cells whose real interval is within the tolerance" in text
    assert "worst 30.0%" in text  # every cell is still shown
    loose = goal_rows(goals(t.assign(converged=False)), ranks, 10.0, ((0.1,), (0.2,)), 75.0)
    error_rows = [r for r in loose.splitlines() if "throughput" in r or "TPOT" in r]
    assert len(error_rows) == 4 and not any("nan" in r for r in error_rows), loose
    assert "the 0 of 3 cells" in loose  # no tight cell: none judged
    row = next(r for r in loose.splitlines() if "every such cell's throughput" in r)
    assert "no such cell" in row and row.endswith("| NOT met |"), loose


def test_gains_are_each_settings_over_none_at_its_load_on_the_metric_a_user_reads():
    """Closed loops: throughput over none's; open loops: none's mean TPOT over the setting's
    (the throughput of an open loop is its arrivals'); a sign is judged beyond +-2%."""
    from specsim.fidelity.llama.report import gains, goals

    nan = float("nan")
    t = pd.DataFrame({
        "spec": ["none", "ngram:3", "none", "ngram:3"], "temperature": [0.0] * 4,
        "concurrency": [3.0, 3.0, nan, nan], "rate": [nan, nan, 0.5, 0.5],
        "real_throughput_tok_s": [200.0, 230.0, 72.0, 73.0],
        "sim_throughput_tok_s": [180.0, 171.0, 71.0, 72.0],
        "real_tpot_ms_mean": [12.0, 10.0, 6.0, 4.0], "sim_tpot_ms_mean": [12.0, 12.0, 8.0, 7.2],
        "err_throughput_wall": [0.0] * 4, "err_tpot_mean_wall": [0.0] * 4,
        "real_accept_per_draft": [nan, 0.6, nan, 0.6], "sim_accept_per_draft": [nan, 0.6, nan, 0.6],
    })  # fmt: skip
    g = gains(t).set_index("load")
    assert g.loc["C=3", "metric"] == "throughput" and g.loc["rate=0.5", "metric"] == "tpot_speedup"
    assert g.loc["C=3", "real_gain"] == pytest.approx(0.15)
    assert g.loc["C=3", "sim_gain"] == pytest.approx(-0.05)  # the sign wrong
    assert g.loc["rate=0.5", "real_gain"] == pytest.approx(0.5)
    assert g.loc["rate=0.5", "gap_points"] == pytest.approx(100 * (8 / 7.2 - 1.5))
    m = goals(t)
    assert (m["gain_signs_judged"], m["gain_signs_wrong"]) == (2.0, 1.0)
    assert m["gain_gap_max_points"] == pytest.approx(100 * (1.5 - 8 / 7.2))
