"""``specsim profile fit`` (issue 64): a built profile anchored on the operator's benchmark runs
without speculation. Checked where the truth is known: runs made by the simulator on a profile
whose GPU time and engine costs differ from the build's (a deployment the build gets wrong by
a known amount), written in each engine's result format, fitted on two concurrencies and
scored on the others and on speculation's gain; and every refusal, one line, exit 2."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from specsim.cli import main
from specsim.sim.cost import build as bd
from specsim.sim.cost.baseline import BaselinePoint, read_baseline
from specsim.sim.cost.build_profile import build
from specsim.sim.cost.fit import fit, fitted_profile, simulated_tpot
from specsim.sim.cost.models import builtin_model

PROMPT, OUT = 400, 200  # the runs' prompt and output tokens (a vllm bench random dataset's)
DEP = ["--model", "llama-3-8b", "--gpu", "h100", "--drafter", "dspark:layers=5,block=7"]


@pytest.fixture(scope="module")
def world():
    """The built profile, the 'real' deployment (GPU time x1.3, 0.6 ms a step, 20 us a
    request) and its runs without speculation at 1, 8, 32 and 64 in flight."""
    dep = bd.Deployment(model=builtin_model("llama-3-8b"), gpu="H100",
                        drafter="dspark:layers=5,block=7")  # fmt: skip
    built = build(dep)[0]
    truth = replace(built, step_ms=np.asarray(built.step_ms) * 1.3,
                    kv_read_us_per_ktoken=built.kv_read_us_per_ktoken * 1.3,
                    step_overhead_ms=0.6, verify_per_request_ms=0.02)  # fmt: skip
    runs = {}
    for c in (1, 8, 32, 64):
        tpot = simulated_tpot(truth, BaselinePoint(c, PROMPT, OUT, 1.0, 1.0, None, "x"), seed=3)
        runs[c] = BaselinePoint(c, PROMPT, OUT, 1000.0 * c / tpot, tpot, None, f"run C={c}")
    return built, truth, runs


def _vllm_json(path, p: BaselinePoint, **extra) -> None:
    n = 100
    path.write_text(json.dumps({
        "max_concurrency": p.concurrency, "completed": n, "total_input_tokens": PROMPT * n,
        "total_output_tokens": OUT * n, "output_throughput": p.output_tok_s,
        "mean_tpot_ms": p.mean_tpot_ms, "mean_ttft_ms": 30.0, **extra,
    }, indent=2))  # fmt: skip


def test_two_runs_recover_the_deployment_and_predict_the_rest(world):
    built, truth, runs = world
    f = fit(built, [runs[1], runs[32]])
    assert f.scale == pytest.approx(1.3, rel=0.1)
    assert np.abs(f.residuals).max() < 0.05
    model = fitted_profile(built, f)
    for c in (8, 64):  # held out: the rest of the no-speculation curve within 10%
        got = simulated_tpot(model, runs[c], seed=3)
        assert got == pytest.approx(runs[c].mean_tpot_ms, rel=0.10), c
    assert "fitted" in model.meta and "TPOT median" in model.meta["fit_residual"]


@pytest.mark.slow
def test_the_gain_of_speculation_on_the_fitted_profile_is_the_deployments(world):
    """The drafter was not fitted (it did not run): its gain still follows, because the
    fitted terms are the ones a verify shares with a decode."""
    from specsim.sim.simulate import replay

    built, truth, runs = world
    model = fitted_profile(built, fit(built, [runs[1], runs[32]]))

    def gain(profile, c: int) -> float:
        kw = dict(concurrency=c, requests=8 * c, seed=1, profile=profile)
        spec = replay("synthetic-chat", "static:7", **kw).summary["throughput_tok_s"]
        return spec / replay("synthetic-chat", "ar", **kw).summary["throughput_tok_s"]

    for c in (8, 32):
        assert gain(model, c) / gain(truth, c) == pytest.approx(1.0, abs=0.05), c


@pytest.mark.slow
@pytest.mark.parametrize("form", ["vllm", "sglang", "csv"])
def test_every_engines_result_format_fits_to_the_same_profile(world, tmp_path, form, capsys):
    built, truth, runs = world
    if form == "vllm":
        files = []
        for c in (1, 32):
            _vllm_json(tmp_path / f"c{c}.json", runs[c])
            files.append(str(tmp_path / f"c{c}.json"))
    elif form == "sglang":  # one JSON object a line, one line a run
        lines = []
        for c in (1, 32):
            _vllm_json(tmp_path / "one.json", runs[c])
            lines.append(json.dumps(json.loads((tmp_path / "one.json").read_text())))
        (tmp_path / "runs.jsonl").write_text("\n".join(lines) + "\n")
        files = [str(tmp_path / "runs.jsonl")]
    else:
        rows = ["concurrency,prompt_tokens,output_tokens,output_tok_s,mean_tpot_ms"]
        rows += [
            f"{c},{PROMPT},{OUT},{runs[c].output_tok_s},{runs[c].mean_tpot_ms}" for c in (1, 32)
        ]
        (tmp_path / "runs.csv").write_text("\n".join(rows) + "\n")
        files = [str(tmp_path / "runs.csv")]
    assert [p.concurrency for f in files for p in read_baseline(f)] == [1, 32]
    out = tmp_path / "fitted.csv"
    assert main(["profile", "fit", *DEP, "--baseline", *files, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "GPU time (x the build)" in text and "residual" in text
    assert main(["profile", "show", str(out)]) == 0
    assert "FITTED on your baseline" in capsys.readouterr().out
    assert main(["replay", "synthetic-chat", "--profile", str(out), "--concurrency", "4",
                 "--requests", "16"]) == 0  # fmt: skip
    assert "FITTED on your baseline" in capsys.readouterr().out


def test_tune_on_a_fitted_profile_anchors_on_the_measured_run(world, tmp_path, capsys):
    built, truth, runs = world
    for c in (1, 32):
        _vllm_json(tmp_path / f"c{c}.json", runs[c])
    out = tmp_path / "fitted.csv"
    assert main(["profile", "fit", *DEP, "--baseline", str(tmp_path / "c1.json"),
                 str(tmp_path / "c32.json"), "--out", str(out)]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["tune", "synthetic-chat", "--engine", "vllm", "--concurrency", "32",
                 "--profile", str(out), "--seeds", "1", "--draft-lens", "3,7"]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "FITTED on your baseline" in text.splitlines()[0]
    assert "your baseline at 32 in flight:" in text and "measured without speculation" in text


# ---- refusals: one line, exit 2, nothing written
def _refused(capsys, tmp_path, files: list[str], match: str) -> None:
    out = tmp_path / "never.csv"
    assert main(["profile", "fit", *DEP, "--baseline", *files, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and match in err, err
    assert not out.exists()


def test_a_fit_needs_two_concurrencies(world, tmp_path, capsys):
    built, truth, runs = world
    _vllm_json(tmp_path / "a.json", runs[8])
    _vllm_json(tmp_path / "b.json", runs[8])
    _refused(capsys, tmp_path, [str(tmp_path / "a.json"), str(tmp_path / "b.json")],
             "two or more concurrencies")  # fmt: skip


def test_a_run_with_speculation_is_refused(world, tmp_path, capsys):
    built, truth, runs = world
    _vllm_json(tmp_path / "a.json", runs[1])
    _vllm_json(tmp_path / "b.json", runs[32], spec_decode_num_drafts=1234)
    _refused(capsys, tmp_path, [str(tmp_path / "a.json"), str(tmp_path / "b.json")],
             "ran with speculation")  # fmt: skip


@pytest.mark.slow
def test_runs_no_profile_explains_are_refused(world, tmp_path, capsys):
    built, truth, runs = world
    _vllm_json(tmp_path / "a.json", runs[1])
    _vllm_json(tmp_path / "b.json", replace(runs[8], mean_tpot_ms=runs[1].mean_tpot_ms * 0.5))
    _vllm_json(tmp_path / "c.json", runs[32])
    _refused(capsys, tmp_path, [str(tmp_path / f"{x}.json") for x in "abc"],
             "no profile of this deployment explains the runs")  # fmt: skip


@pytest.mark.parametrize(
    "content, match",
    [("", "is empty"), ("{not json", "is not JSON"), ('{"max_concurrency": 4}', "completed"),
     ('{"max_concurrency": null, "completed": 3}', "closed loop"),
     ('[1, 2]', "not a JSON object"),
     ('{"max_concurrency": 4, "completed": 10, "total_input_tokens": 1e400}', "finite")],
)  # fmt: skip
def test_a_file_that_is_no_result_is_one_line(tmp_path, capsys, content, match):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    _refused(capsys, tmp_path, [str(bad), str(bad)], match)


def test_a_baseline_csv_without_its_columns_or_a_folder_is_one_line(tmp_path, capsys):
    (tmp_path / "b.csv").write_text("concurrency,tok_s\n1,100\n")
    _refused(capsys, tmp_path, [str(tmp_path / "b.csv")], "lacks column(s)")
    _refused(capsys, tmp_path, [str(tmp_path)], "not a folder")


@pytest.mark.slow
def test_a_trace_far_from_the_runs_lengths_is_warned_about(world, tmp_path):
    """Runs of 400 / 200 tokens fit the terms their steps exercised; a workload of other lengths
    is warned about by replay and tune (the fit may not hold there), and one alike is not."""
    import warnings

    from specsim.sim.cost.baseline import lengths_warning
    from specsim.sim.simulate import replay
    from specsim.trace.io import read_trace

    built, truth, runs = world
    model = fitted_profile(built, fit(built, [runs[1], runs[32]]))
    alike = replace(runs[1], prompt_tokens=500.0, output_tokens=300.0)  # within 2x: silent
    near = fitted_profile(built, fit(built, [alike, replace(runs[32], prompt_tokens=500.0,
                                                            output_tokens=300.0)]))  # fmt: skip
    chat = read_trace("traces/synthetic-chat.parquet")  # ~500 prompt / ~220 output tokens
    far = replace(model, meta={**model.meta, "baseline_lengths": "8000:2000"})
    assert lengths_warning(far, chat) and "fit on runs of this workload" in lengths_warning(
        far, chat
    )
    assert lengths_warning(near, chat) is None
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        replay(chat, "ar", concurrency=4, requests=16, profile=far)
    assert any("fitted on runs whose requests differ" in str(w.message) for w in got)
