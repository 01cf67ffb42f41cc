"""``profile fit --profile``: any profile (measured, imported, built) anchored on the operator's
runs without speculation (issue 64). Checked where the truth is known: runs the simulator makes
on the shipped CPU profile (a 2-D table measured against context) with its GPU time x0.7 and an
engine overhead it never had, fitted back at three concurrencies and scored on a fourth; and the
refusals, one line, exit 2."""

from __future__ import annotations

import csv
from dataclasses import replace

import numpy as np
import pytest

from specsim.cli import main
from specsim.sim.cost.baseline import BaselinePoint
from specsim.sim.cost.fit import fit, fitted_profile, simulated_tpot
from specsim.sim.cost.profiles import get_profile

PROMPT, OUT = 80, 60
BASE = "smollm2-135m-cpu"


@pytest.fixture(scope="module")
def world():
    base = get_profile(BASE)
    truth = replace(base, step_ms=np.asarray(base.step_ms) * 0.7, step_overhead_ms=4.0,
                    verify_per_request_ms=1.5)  # fmt: skip
    runs = {}
    for c in (2, 4, 8, 16):
        tpot = simulated_tpot(truth, BaselinePoint(c, PROMPT, OUT, 1.0, 1.0, None, "x"), seed=1)
        runs[c] = BaselinePoint(c, PROMPT, OUT, 1000.0 * c / tpot, tpot, None, f"run C={c}")
    return base, truth, runs


def test_a_measured_2d_profile_is_anchored_and_predicts_a_held_out_concurrency(world):
    base, _, runs = world
    f = fit(base, [runs[2], runs[4], runs[16]])
    assert f.scale == pytest.approx(0.7, rel=0.15)
    model = fitted_profile(base, f)
    assert model.is_2d and "fitted" in model.meta
    got = simulated_tpot(model, runs[8], seed=1)
    assert got == pytest.approx(runs[8].mean_tpot_ms, rel=0.10)
    unfitted = simulated_tpot(base, runs[8], seed=1)
    assert abs(unfitted / runs[8].mean_tpot_ms - 1) > 2 * abs(got / runs[8].mean_tpot_ms - 1)


def test_a_measured_overhead_curve_gives_way_to_the_fitted_line(world):
    base, _, runs = world
    curved = replace(base, overhead_curve=((1, 0.5), (4, 3.0), (16, 20.0)))
    model = fitted_profile(curved, fit(curved, [runs[2], runs[16]]))
    assert model.overhead_curve == ()
    assert "overhead curve replaced by the fitted line" in model.meta["fitted"]


def _csv(path, runs) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["concurrency", "prompt_tokens", "output_tokens", "output_tok_s",
                    "mean_tpot_ms"])  # fmt: skip
        for p in runs:
            w.writerow([p.concurrency, p.prompt_tokens, p.output_tokens, p.output_tok_s,
                        p.mean_tpot_ms])  # fmt: skip


def test_the_cli_anchors_a_shipped_profile_and_says_so(world, tmp_path, capsys):
    _, _, runs = world
    _csv(tmp_path / "b.csv", [runs[2], runs[16]])
    out = tmp_path / "fitted.csv"
    assert main(["profile", "fit", "--profile", BASE, "--baseline", str(tmp_path / "b.csv"),
                 "--out", str(out)]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "fitted on 2 runs without speculation" in text and "the drafter as given" in text
    assert main(["profile", "show", str(out)]) == 0
    assert "FITTED on your baseline" in capsys.readouterr().out


@pytest.mark.parametrize("extra, match", [
    (["--model", "llama-3-8b", "--profile", BASE], "--model (and the deployment) or --profile"),
    ([], "needs the deployment (--model"),
    (["--profile", "/nonexistent/p.csv"], "p.csv"),
])  # fmt: skip
def test_a_fit_without_one_base_is_refused_in_one_line(world, tmp_path, capsys, extra, match):
    _, _, runs = world
    _csv(tmp_path / "b.csv", [runs[2], runs[16]])
    argv = ["profile", "fit", *extra, "--baseline", str(tmp_path / "b.csv"), "--out",
            str(tmp_path / "o.csv")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert match in err and len(err.splitlines()) == 1
    assert not (tmp_path / "o.csv").exists()


def test_out_may_not_overwrite_the_profile_it_anchors(world, tmp_path, capsys):
    _, _, runs = world
    _csv(tmp_path / "b.csv", [runs[2], runs[16]])
    from specsim.sim.cost.profile_csv import write_profile_csv

    mine = tmp_path / "mine.csv"
    write_profile_csv(get_profile(BASE), mine)
    before = mine.read_bytes()
    argv = ["profile", "fit", "--profile", str(mine), "--baseline", str(tmp_path / "b.csv"),
            "--out", str(mine), "--force"]  # fmt: skip
    assert main(argv) == 2
    assert "is the --profile it anchors" in capsys.readouterr().err
    assert mine.read_bytes() == before


def test_a_base_dearer_a_step_than_the_server_is_fitted_below_zero_and_said_so(world):
    base, _, _ = world
    table = np.asarray(base.step_ms)
    truth = replace(base, step_ms=table * 0.6 - 30.0)  # 30 ms less fixed cost a step
    runs = []
    for c in (2, 8, 16):
        tpot = simulated_tpot(truth, BaselinePoint(c, PROMPT, OUT, 1.0, 1.0, None, "x"), seed=1)
        runs.append(BaselinePoint(c, PROMPT, OUT, 1000.0 * c / tpot, tpot, None, f"C={c}"))
    f = fit(base, runs)
    assert f.step_ms < 0 and np.abs(f.residuals).max() < 0.10
    model = fitted_profile(base, f)
    assert model.step_overhead_ms == 0.0 and float(np.min(model.step_ms)) > 0
    assert "negative step taken off the table" in model.meta["fitted"]
    held = BaselinePoint(4, PROMPT, OUT, 1.0, 1.0, None, "x")
    want = simulated_tpot(truth, held, seed=1)
    assert simulated_tpot(model, held, seed=1) == pytest.approx(want, rel=0.10)
