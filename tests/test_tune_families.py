"""``specsim tune --family``: several drafters, each tuned as tune tunes one, ranked per load.

- a real run (profiles from ``profile build``, traces from ``traces synth``, two loads, two
  seeds): a row per load x family, none among them, paired intervals, one pick per load, a
  band summary and a config per band that parses as the engine parses it;
- a drafter that clearly accepts more, on the same profile, wins at one request in flight, and
  the same seeds give the same table;
- the hostile inputs are one line each and exit 2.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import shlex
from pathlib import Path

import pandas as pd
import pytest

from specsim.analysis.tune.families import tune_families
from specsim.analysis.tune.family_configs import chain_grid, render_family
from specsim.analysis.tune.run import TuneConfig
from specsim.cli import main
from specsim.commands.tune_families import as_json, report


def _quiet(argv: list[str]) -> int:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return main(argv)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """Three built profiles (no drafter, EAGLE-3, DSpark; llama-3.1-8b on an H100) and three
    synthetic traces of one workload (same seed: same lengths): DSpark-like (chat curve, block
    7), an EAGLE-3-like chain (AL 3.2, 3 drafts) and a poor chain (AL 1.4)."""
    d = tmp_path_factory.mktemp("families")
    build = ["profile", "build", "--model", "llama-3.1-8b", "--gpu", "H100", "--drafter"]
    for name, drafter in (("none", "none"), ("e3", "eagle3"),
                          ("ds", "dspark:layers=5,width=4096,block=7")):  # fmt: skip
        assert _quiet([*build, drafter, "--out", str(d / f"{name}.csv")]) == 0
    synth = ["traces", "synth", "--requests", "40"]
    for name, how in (("ds", ["--profile", "chat"]), ("e3", ["--al", "3.2", "--block-size", "3"]),
                      ("poor", ["--al", "1.4", "--block-size", "3"])):  # fmt: skip
        assert _quiet([*synth, *how, "--out", str(d / f"{name}.parquet")]) == 0
    return d


@pytest.fixture(scope="module")
def result(files):
    """dspark, eagle3 and none at 1 and 16 in flight, two seeds, a small grid."""
    cfg = TuneConfig(engine="vllm", concurrency=(1, 16), requests=48, seeds=2, draft_lens=(2, 4))
    specs = [f"dspark={files / 'ds.parquet'}@{files / 'ds.csv'}",
             f"eagle3={files / 'e3.parquet'}@{files / 'e3.csv'}",
             f"none@{files / 'none.csv'}"]  # fmt: skip
    return tune_families(specs, cfg)


# ------------------------------------------------------------------ the real run
@pytest.mark.slow
def test_a_row_per_load_and_family_with_none_and_intervals(result):
    frame = result.frame()
    assert len(frame) == 2 * 3 and "family" in frame.columns
    for fl in result.loads:
        assert [r["family"] for r in fl.rows] == ["dspark", "eagle3", "none"]
        assert sum(r["recommended"] for r in fl.rows) == 1 and fl.best is not None
        assert fl.rows[fl.best]["best"] and fl.rows[fl.best]["sla_met"]
        for r in fl.rows:
            assert len(fl.samples[fl.rows.index(r)]) == 2  # both seeds, paired across families
            if not r["best"]:
                assert math.isfinite(r["vs_best_pct"]) and math.isfinite(r["vs_best_ci_pct"])
        none = fl.rows[fl.none]
        assert none["policy"] == "ar" and none["vs_none_pct"] == 0.0
        assert all(r["tau"] > 2 for r in fl.rows if r["family"] != "none")
        assert fl.verdict.startswith(f"at {fl.load.describe()}")
    eagle = next(f for f in result.families if f.name == "eagle3")
    assert eagle.method == "eagle3" and eagle.max_k == 3  # the profile prices 3 steps


def test_every_family_is_tuned_with_its_own_knobs(result):
    ds, e3 = result.results["dspark"], result.results["eagle3"]
    assert any("adaptive" in c.label for c in ds.candidates)  # DSpark's grid, adaptive included
    assert not any("adaptive" in c.label for c in e3.candidates)  # vLLM: DSpark only
    assert {c.label for c in e3.candidates} == {"no speculation", "k=3", "k=2"}
    assert ds.seeds == e3.seeds == result.seeds == (0, 1)


def test_bands_cover_the_loads_and_their_configs_parse(result):
    data = json.loads(json.dumps(as_json(result), default=str))
    assert data["mode"] == "families" and data["summary"].startswith("per concurrency band: C 1")
    assert sorted(x for b in data["bands"] for x in b["loads"]) == [1, 16]
    assert set(data["per_family"]) == {"dspark", "eagle3"}
    for band in data["bands"]:
        ec = band["engine_config"]
        if band["family"] == "none":
            assert "speculation off" in ec["text"]
            continue
        argv = shlex.split(ec["text"])
        assert argv[0] == "--speculative-config" and len(argv) == 2
        spec = json.loads(argv[1])
        assert spec == ec["data"] and spec["method"] == band["family"]
        assert spec["num_speculative_tokens"] >= 1
    text = report(result)
    assert text.count("== load:") == 2 and data["summary"] in text
    assert text.count("config to paste for") == len(data["bands"])


# ------------------------------------------------------------------ a clearly better drafter
def _pair(files: Path, seed: int = 0):
    cfg = TuneConfig(engine="vllm", concurrency=(1,), requests=30, seeds=3, seed=seed)
    specs = [f"eagle3-poor={files / 'poor.parquet'}@{files / 'e3.csv'}",
             f"eagle3-good={files / 'e3.parquet'}@{files / 'e3.csv'}",
             f"none@{files / 'none.csv'}"]  # fmt: skip
    return tune_families(specs, cfg)


@pytest.mark.slow
def test_the_drafter_that_accepts_more_wins_at_one_in_flight(files):
    """Same profile, same workload, AL 3.2 against AL 1.4: the better one is best and picked,
    the poor one is outside the noise of it, and speculation beats none."""
    res = _pair(files)
    fl = res.loads[0]
    rows = {r["family"]: r for r in fl.rows}
    assert fl.recommended_row["family"] == "eagle3-good" and rows["eagle3-good"]["best"]
    assert not rows["eagle3-poor"]["within_noise"] and rows["eagle3-poor"]["vs_best_pct"] < -10
    good = rows["eagle3-good"]
    assert good["vs_none_pct"] - good["vs_none_ci_pct"] > 0
    assert [f.method for f in res.families] == ["eagle3", "eagle3", "none"]  # from the profile
    pd.testing.assert_frame_equal(res.frame(), _pair(files).frame())  # same seed, same table


@pytest.mark.slow
def test_sglang_configs_and_out_table_from_the_command_line(files, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(files)
    out = tmp_path / "families.parquet"
    code = main(["tune", "--engine", "sglang", "--concurrency", "1", "--requests", "30",
                 "--seeds", "2", "--family", "eagle3=e3.parquet@e3.csv",
                 "--family", "poor=poor.parquet@e3.csv", "--out", str(out)])  # fmt: skip
    text, err = capsys.readouterr()
    assert code == 0 and "Traceback" not in err
    lines = text.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith("config to paste for C 1: eagle3"))
    argv = shlex.split(lines[i + 1])
    flags = dict(zip(argv[::2], argv[1::2], strict=True))
    assert flags["--speculative-algorithm"] == "EAGLE3" and flags["--speculative-eagle-topk"] == "1"
    steps = int(flags["--speculative-num-steps"])
    assert int(flags["--speculative-num-draft-tokens"]) == steps + 1  # a chain: the root + k
    table = pd.read_parquet(out)
    assert list(table["family"]) == ["eagle3", "poor", "none"] and table["recommended"].sum() == 1


def test_each_family_renders_in_its_engines_names():
    mtp = render_family("vllm", "mtp", {"num_speculative_tokens": 2})
    assert json.loads(shlex.split(mtp.text)[1]) == {"method": "mtp", "num_speculative_tokens": 2}
    nextn = dict(zip(*[iter(shlex.split(render_family("sglang", "mtp", {
        "speculative_num_steps": 2, "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 3}).text))] * 2, strict=True))  # fmt: skip
    assert nextn["--speculative-algorithm"] == "NEXTN"
    assert "--speculative-draft-model-path" not in nextn  # the target's own MTP weights
    knobs = {"num_speculative_tokens": 4, "enable_adaptive_verification": True}
    ds = render_family("vllm", "dspark", knobs, block=7)
    assert json.loads(shlex.split(ds.text)[1])["enable_adaptive_verification"] is True
    free = render_family("vllm", None, {"num_speculative_tokens": 2}, label="mine")
    assert "no vLLM config" in free.text
    cfg = TuneConfig(engine="vllm", concurrency=(1,))
    assert [c.label for c in chain_grid(cfg, 5, method="eagle3", max_k=3)] == [
        "no speculation", "k=3", "k=1", "k=2"]  # fmt: skip


# ------------------------------------------------------------------ hostile input
def _refused(argv: list[str], capsys) -> str:
    try:
        code = main(["tune", "--engine", "vllm", "--concurrency", "1", *argv])
    except SystemExit as exc:
        code = int(exc.code)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


REFUSALS = [
    (["--family", "eagle3:e3.parquet@e3.csv", "--family", "none@none.csv"], "has no '='"),
    (["--family", "eagle3=e3.parquet", "--family", "none@none.csv"], "names no profile"),
    (["--family", "eagle3=missing.parquet@e3.csv", "--family", "none@none.csv"],
     "--family eagle3: trace file 'missing.parquet' does not exist"),
    (["--family", "eagle3=e3.parquet@missing.csv", "--family", "none@none.csv"],
     "--family eagle3: profile file 'missing.csv' does not exist"),
    (["--family", "eagle3=e3.parquet@e3.csv", "--family", "EAGLE3=poor.parquet@e3.csv"],
     "given twice"),
    (["--family", "eagle3=e3.parquet@none.csv", "--family", "dspark=ds.parquet@ds.csv"],
     "built with --drafter none"),
    (["--family", "eagle3=e3.parquet@e3.csv"], "given once"),
    (["e3.parquet", "--family", "eagle3=e3.parquet@e3.csv", "--family", "none@none.csv"],
     "drop TRACE"),
    (["--profile", "e3.csv", "--family", "eagle3=e3.parquet@e3.csv", "--family", "none@none.csv"],
     "drop --profile"),
    ([], "give TRACE"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "says"), REFUSALS, ids=[s for _, s in REFUSALS])
def test_hostile_input_is_one_line_and_exit_2(files, capsys, monkeypatch, argv, says):
    monkeypatch.chdir(files)
    assert says in _refused(argv, capsys)


def test_an_engine_without_family_configs_is_refused(files, capsys, monkeypatch):
    monkeypatch.chdir(files)
    line = _refused(["--family", "eagle3=e3.parquet@e3.csv", "--family", "none@none.csv",
                     "--engine", "llama"], capsys)  # fmt: skip
    assert "use --engine vllm or sglang" in line
