"""``specsim validate`` and ``specsim engine`` end to end on a tiny random target (the CI grid:
seconds), their refusals, and the pure comparison helpers."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from record_tiny import prompts_file, tiny_dir

pytest.importorskip("torch")

from specsim.analysis.validate import METRICS, compare, parse_grid  # noqa: E402
from specsim.cli import main  # noqa: E402
from specsim.errors import SpecsimError  # noqa: E402
from specsim.sim.profiles import read_profile_csv  # noqa: E402


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("validate")
    return {
        "dir": d,
        "target": str(tiny_dir(d / "tiny")),
        "prompts": str(prompts_file(d / "p.jsonl", 6)),
    }


def base_args(s, out, trace, *extra):
    return [
        "validate", "--target", s["target"], "--drafter", "ngram", "--trace", str(trace),
        "--prompts", s["prompts"], "--max-new-tokens", "20", "--contexts", "64",
        "--repeats", "2", "--out", str(out), *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def report(setup):
    out = setup["dir"] / "rep"
    trace = setup["dir"] / "t.parquet"
    rc = main(
        base_args(setup, out, trace, "--policies", "ar,full,hw-aware", "--concurrency", "1,3")
    )
    assert rc == 0
    return out, trace


def test_grid_table_is_complete(report):
    out, _ = report
    table = pd.read_csv(out / "fidelity.csv")
    assert len(table) == 6
    assert set(zip(table.policy, table.concurrency, strict=True)) == {
        (p, c) for p in ("ar", "full", "hw-aware") for c in (1, 3)
    }
    for m in METRICS:
        assert np.all(np.isfinite(table[f"real_{m}"])) and np.all(table[f"real_{m}"] > 0)
        want = (table[f"sim_{m}"] - table[f"real_{m}"]) / table[f"real_{m}"]
        assert np.allclose(table[f"err_{m}"], want, rtol=1e-3, atol=1e-4)  # CSV keeps 6 digits


def test_greedy_replay_matches_the_engine_exactly(report):
    """Same prompts, drafter and policy at T = 0: the simulator's tau and output lengths are
    the engine's (only timing may differ)."""
    table = pd.read_csv(report[0] / "fidelity.csv")
    assert (table["length_mismatch"] == 0).all()
    assert np.allclose(table["real_tau"], table["sim_tau"], rtol=1e-9)
    assert (table.loc[table.policy == "ar", "real_tau"] == 1.0).all()
    assert (table.loc[table.policy == "full", "real_tau"] > 1.0).all()


def test_report_files(report):
    out, trace = report
    assert trace.exists()
    for name in ("README.md", "fidelity.png", "engine_steps.parquet", "profile.csv", "config.json"):
        assert (out / name).exists(), name
    cost = read_profile_csv(out / "profile.csv")
    assert cost.b_max >= 64 and cost.draft_per_request_ms >= 0
    steps = pd.read_parquet(out / "engine_steps.parquet")
    assert {
        "policy",
        "concurrency",
        "time_s",
        "batch_tokens",
        "accepted_drafts",
        "draft_s",
        "verify_s",
    } <= set(steps.columns)
    assert "| hw-aware | 3 |" in (out / "README.md").read_text()
    assert json.loads((out / "config.json").read_text())["drafter"] == "ngram:3"


def test_refuses_to_overwrite_without_force(report, setup, capsys):
    out, trace = report
    rc = main(base_args(setup, out, trace, "--policies", "ar", "--concurrency", "1"))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--force" in err[0]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--policies", "no-such-policy"], "no-such-policy"),
        (["--concurrency", "1,x"], "--concurrency"),
        (["--drafter", "ngram:2"], "drafter"),  # the trace was recorded with ngram:3
    ],
)
def test_bad_input_is_one_line(report, setup, capsys, extra, needle):
    _, trace = report
    rc = main(base_args(setup, setup["dir"] / "other", trace, *extra))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and needle in err[0], err


def test_engine_command_writes_logs(setup, capsys):
    out = setup["dir"] / "eng"
    args = ["engine", "--target", setup["target"], "--drafter", "ngram", "--prompts",
            setup["prompts"], "--policy", "full", "--concurrency", "2", "--max-new-tokens",
            "12", "--profile", "h100-dense-8b", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["requests_completed"] == 6 and summary["tau"] > 1.0
    steps = pd.read_parquet(out / "steps.parquet")
    assert int(steps["emitted_tokens"].sum()) == summary["output_tokens"]
    assert len(pd.read_parquet(out / "requests.parquet")) == 6
    assert sum(1 for _ in open(out / "outputs.jsonl")) == 6
    assert main(args) == 2  # no overwrite without --force
    assert "--force" in capsys.readouterr().err


def test_compare_and_grid_helpers():
    real = dict.fromkeys(METRICS, 10.0)
    sim = dict.fromkeys(METRICS, 11.0)
    row = compare(real, sim)
    assert row["err_tau"] == pytest.approx(0.1) and row["sim_tpot_ms_mean"] == 11.0
    cells = parse_grid("ar, full", "1,4")
    assert [(c.policy, c.concurrency) for c in cells] == [
        ("ar", 1),
        ("ar", 4),
        ("full", 1),
        ("full", 4),
    ]
    with pytest.raises(SpecsimError):
        parse_grid("ar", "0")
