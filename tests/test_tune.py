"""``specsim tune``: the grid per engine, the best row, the config to paste, the CLI's errors."""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

from specsim.analysis.tune.configs import render
from specsim.analysis.tune.run import (
    ENGINES,
    Candidate,
    Load,
    TuneConfig,
    candidates,
    explain,
    maximize,
    pick_best,
    truncate_block,
    tune,
)
from specsim.cli import main
from specsim.errors import SpecsimError
from specsim.trace.io import read_trace

TRACE = "traces/synthetic-chat.parquet"
REPO = Path(__file__).resolve().parents[1]
SMALL = {"requests": 40, "draft_lens": (1, 3, 7), "gains": (0.0, 0.04), "p_mins": (0.0, 0.3)}


@pytest.fixture(scope="module")
def trace():
    return read_trace(TRACE)


@pytest.fixture(scope="module")
def results(trace):
    """One small search per engine at 8 in flight, under a TPOT SLA some settings miss."""
    return {
        e: tune(trace, TuneConfig(engine=e, concurrency=(8,), slo="tpot=9", **SMALL))
        for e in ENGINES
    }


@pytest.mark.slow
@pytest.mark.parametrize("engine", ENGINES)
def test_best_is_the_argmax_of_the_objective_among_rows_meeting_the_sla(results, engine):
    lr = results[engine].loads[0]
    ok = [r for r in lr.rows if r["sla_met"]]
    assert ok, "the SLA is loose enough for some setting"
    top = max(r["objective"] for r in ok)
    assert lr.best_row is not None and lr.best_row["objective"] == top
    assert lr.best_row["sla_met"] and sum(r["best"] for r in lr.rows) == 1
    assert results[engine].objective == "throughput" and maximize("throughput")


@pytest.mark.parametrize("engine", ENGINES)
def test_default_and_no_speculation_rows_are_present(results, engine):
    res = results[engine]
    roles = [r["role"] for r in res.loads[0].rows]
    assert roles.count("default") == 1 and roles.count("no-spec") == 1
    assert res.loads[0].rows[res.loads[0].no_spec]["policy"] == "ar"
    d = res.loads[0].rows[res.loads[0].default]
    block = res.block
    expected = {
        "vllm": f"num_speculative_tokens={block}, enable_adaptive_verification=false",
        "trtllm": f"max_draft_len={block}, enable_confidence_scheduling=false",
        "sglang": f"speculative_dspark_block_size={block}, "
        f"speculative_num_draft_tokens={block + 1}",
        "llama": f"spec_draft_n_max={block}, spec_draft_p_min=0",
    }[engine]
    assert d["knobs"] == expected
    policies = [(c.policy, c.block) for c in res.candidates]
    assert len(policies) == len(set(policies)), "no setting is replayed twice"


def test_grids_hold_each_engines_knobs(trace):
    block = trace.block_size
    cfg = TuneConfig(engine="vllm", concurrency=(8,))
    vllm = candidates(cfg, block)
    assert {c.label for c in vllm} >= {f"k={k} adaptive" for k in range(1, block + 1)}
    k3 = next(c for c in vllm if c.label == "k=3 adaptive")  # what replay takes, as is
    assert k3.policy == "vllm-adaptive:3" and k3.block is None
    trt = candidates(TuneConfig(engine="trtllm", concurrency=(8,)), block)
    gains = {dict(c.knobs).get("confidence_min_predicted_gain") for c in trt}
    assert {0.0, 0.02, 0.04, 0.08} <= gains
    assert any(c.policy.startswith("trtllm-schedule:") for c in trt)
    sg = candidates(TuneConfig(engine="sglang", concurrency=(8,)), block)
    assert all(
        dict(c.knobs)["speculative_num_draft_tokens"]
        == dict(c.knobs)["speculative_dspark_block_size"] + 1
        for c in sg
        if c.knobs
    )
    ll = candidates(TuneConfig(engine="llama", concurrency=(8,), p_mins=(0.0, 0.5)), block)
    assert any(c.policy == f"llama-dspark:0.5:{block}" for c in ll)


def test_truncated_block_keeps_the_first_k_drafts(trace):
    t3 = truncate_block(trace, 3)
    assert t3.block_size == 3 and t3.meta["block_size"] == "3"
    np.testing.assert_array_equal(t3.conf, trace.conf[:, :3])
    np.testing.assert_array_equal(t3.accept_len, np.minimum(trace.accept_len, 3))
    assert truncate_block(trace, trace.block_size) is trace


def test_pick_best_breaks_ties_to_the_first_and_skips_sla_misses():
    rows = [
        {"objective": 5.0, "sla_met": True},
        {"objective": 5.0, "sla_met": True},
        {"objective": 9.0, "sla_met": False},
        {"objective": float("nan"), "sla_met": True},
    ]
    assert pick_best(rows, "throughput") == 0
    assert pick_best(rows, "tpot") == 0
    rows[1]["objective"] = 4.0
    assert pick_best(rows, "tpot") == 1  # lower is better
    assert pick_best([{"objective": 1.0, "sla_met": False}], "throughput") is None


def test_verdict_says_by_how_much_and_why(results):
    lr = results["vllm"].loads[0]
    if lr.best == lr.default:
        assert "is the best setting" in lr.verdict
    else:
        assert re.search(r"[+-]\d+(\.\d)?%", lr.verdict)
        assert "step" in lr.verdict or "does not resolve" in lr.verdict
    base = {"objective": 100.0, "sla_met": True, "sla_misses": "", "tau": 1.5, "step_ms": 20.0,
            "verified_per_step": 7.0, "role": "default", "candidate": "k=7"}  # fmt: skip
    best = {**base, "objective": 150.0, "tau": 1.3, "verified_per_step": 2.0, "step_ms": 10.0,
            "role": "grid", "candidate": "k=2"}  # fmt: skip
    text = explain([base, best], 1, 0, Load("concurrency", 64), "throughput", 90, "vllm")
    assert "+50%" in text and "64 in flight" in text and "7.0 drafts" in text and "+100%" in text


def _vllm_json(text: str) -> dict:
    argv = shlex.split(text)
    assert argv[0] == "--speculative-config" and len(argv) == 2
    return json.loads(argv[1])


def test_vllm_config_parses_as_json_with_vllms_names():
    cfg = render("vllm", {"num_speculative_tokens": 3, "enable_adaptive_verification": True},
                 block=7)  # fmt: skip
    data = _vllm_json(cfg.text)
    assert data == cfg.data and data["method"] == "dspark"
    assert data["num_speculative_tokens"] == 3 and data["enable_adaptive_verification"] is True
    assert any("first 3 drafts" in n for n in cfg.notes), (
        "a block shorter than the drafter's says how it was predicted"
    )
    assert "speculation off" in render("vllm", {}).text


def _yaml_load(text: str) -> dict:
    try:
        import yaml
    except ModuleNotFoundError:  # a simple check: two-space nesting, key: value lines
        assert all(re.fullmatch(r"( {2})*[A-Za-z0-9_]+:( .+)?", ln) for ln in text.splitlines())
        return {}
    return yaml.safe_load(text)


def test_trtllm_config_parses_as_yaml_with_dspark_decoding_config_fields():
    knobs = {"max_draft_len": 7, "enable_confidence_scheduling": True,
             "confidence_min_predicted_gain": 0.04,
             "draft_len_schedule": ((4, 7), (16, 3))}  # fmt: skip
    cfg = render("trtllm", knobs, block=7, drafter="my drafter: v2", cost_table="1e5")
    data = _yaml_load(cfg.text)
    if data:
        sc = data["speculative_config"]
        assert sc == cfg.data
        assert sc["decoding_type"] == "DSpark" and sc["max_draft_len"] == 7
        assert sc["confidence_min_predicted_gain"] == 0.04 and sc["enable_confidence_scheduling"]
        assert (
            sc["confidence_cost_table_path"] == "1e5"
            and sc["speculative_model"] == "my drafter: v2"
        )
        assert sc["draft_len_schedule"] == {4: 7, 16: 3}
    # every field name is one TensorRT-LLM's source names, as policies/engines.py cites it
    engines_src = (REPO / "specsim/policies/engines.py").read_text()
    for name in ("enable_confidence_scheduling", "confidence_min_predicted_gain",
                 "draft_len_schedule", "DSparkDecodingConfig"):  # fmt: skip
        assert name in engines_src
    assert "confidence_cost_table_path" in (REPO / "specsim/sim/cost/profile_export.py").read_text()


def test_sglang_flags_give_gamma_plus_one_draft_tokens():
    cfg = render("sglang", {"speculative_dspark_block_size": 4, "speculative_num_draft_tokens": 5})
    argv = shlex.split(cfg.text)
    flags = dict(zip(argv[::2], argv[1::2], strict=True))
    assert flags["--speculative-algorithm"] == "DSPARK"
    assert (
        int(flags["--speculative-num-draft-tokens"])
        == int(flags["--speculative-dspark-block-size"]) + 1
    )


def test_llama_flags_are_the_llama_server_flags_the_repo_uses():
    cfg = render("llama", {"spec_draft_n_max": 7, "spec_draft_p_min": 0.3})
    argv = shlex.split(cfg.text)
    flags = dict(zip(argv[::2], argv[1::2], strict=True))
    assert flags["--spec-type"] == "draft-dspark" and flags["--spec-draft-n-max"] == "7"
    assert float(flags["--spec-draft-p-min"]) == 0.3
    used = (REPO / "specsim/record/draft_gguf.py").read_text()  # draft_dspark_args
    assert all(f'"{f}"' in used for f in flags)


def _cli(args: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(args)
    except SystemExit as exc:  # argparse's own refusals (an unknown --engine choice)
        code = int(exc.code)
    out, err = capsys.readouterr()
    return code, out, err


BASE = ["tune", TRACE, "--engine", "sglang", "--concurrency", "8", "--requests", "40"]


@pytest.mark.parametrize(
    "args",
    [
        ["tune", TRACE, "--engine", "tgi", "--concurrency", "8"],
        ["tune", TRACE, "--engine", "vllm", "--concurrency", "-4"],
        ["tune", "no-such-trace.parquet", "--engine", "vllm", "--concurrency", "8"],
        ["tune", TRACE, "--engine", "vllm"],
        [*BASE, "--requests", "5"],  # too few for a steady window at 8 in flight
        [*BASE, "--slo", "tpot=-1"],
        [*BASE, "--objective", "goodput"],
        [*BASE, "--trtllm-cost-table", "x.json"],
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    code, out, err = _cli(args, capsys)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "error" in err


@pytest.mark.slow
def test_json_parses_and_names_best_default_and_config(capsys):
    code, out, _ = _cli([*BASE, "--slo", "tpot=9", "--json"], capsys)
    assert code == 0
    obj = json.loads(out)
    lr = obj["loads"][0]
    assert obj["engine"] == "sglang" and obj["config"]["concurrency"] == [8]
    assert lr["default"]["role"] == "default" and lr["no_speculation"]["policy"] == "ar"
    assert lr["best"]["best"] is True and lr["engine_config"]["text"].startswith("--speculative")


@pytest.mark.slow  # fast suite under 5 min: over 2.5 s alone (CI runs it)
def test_text_output_has_the_table_the_best_and_the_config(capsys):
    code, out, _ = _cli([*BASE, "--concurrency", "2,8"], capsys)
    assert code == 0
    assert out.count("== load:") == 2 and "(default)" in out and "no speculation" in out
    assert "config to paste (SGLang):" in out and "best:" in out


@pytest.mark.slow  # fast suite under 5 min: over 2.5 s alone (CI runs it)
def test_deterministic_for_a_seed(trace):
    cfg = TuneConfig(engine="trtllm", concurrency=(8,), requests=40, draft_lens=(2, 7),
                     gains=(0.04,), seed=3)  # fmt: skip
    a, b = tune(trace, cfg).frame(), tune(trace, cfg).frame()
    assert a.equals(b)
    other = tune(trace, TuneConfig(**{**cfg.as_dict(), "seed": 4})).frame()
    assert not a["throughput_tok_s"].equals(other["throughput_tok_s"])


@pytest.mark.slow
def test_out_writes_the_table_and_never_overwrites(tmp_path, capsys):
    out = tmp_path / "tune.csv"
    code, _, _ = _cli([*BASE, "--out", str(out)], capsys)
    assert code == 0
    import pandas as pd

    frame = pd.read_csv(out)
    assert {"candidate", "throughput_tok_s", "tpot_ms_p90", "sla_met", "best"} <= set(frame)
    code, _, err = _cli([*BASE, "--out", str(out)], capsys)
    assert code == 2 and "--force" in err


@pytest.mark.slow
def test_trtllm_cost_table_is_written_and_named(tmp_path, capsys):
    table = tmp_path / "cost_table.json"
    args = ["tune", TRACE, "--engine", "trtllm", "--concurrency", "8", "--requests", "40",
            "--draft-lens", "7", "--gains", "0", "--json",
            "--trtllm-cost-table", str(table)]  # fmt: skip
    code, out, _ = _cli(args, capsys)
    assert code == 0
    obj = json.loads(table.read_text())
    assert {"token_counts", "step_time_ms"} <= set(obj)
    best = json.loads(out)["loads"][0]
    if best["engine_config"]["data"].get("enable_confidence_scheduling"):
        assert best["engine_config"]["data"]["confidence_cost_table_path"] == str(table)


def test_open_loop_scores_tpot_by_default(trace):
    res = tune(trace, TuneConfig(engine="sglang", rate=(20.0,), requests=60, draft_lens=(1, 7)))
    assert res.objective == "tpot" and not maximize("tpot")
    lr = res.loads[0]
    assert lr.best_row["objective"] == min(r["objective"] for r in lr.rows if r["sla_met"])
    assert math.isfinite(lr.best_row["throughput_tok_s"])


def test_config_refuses_what_it_cannot_search():
    with pytest.raises(SpecsimError, match="unknown engine"):
        TuneConfig(engine="tgi", concurrency=(8,))
    with pytest.raises(SpecsimError, match="one load"):
        TuneConfig(engine="vllm")
    with pytest.raises(SpecsimError, match="draft-lens"):
        TuneConfig(engine="vllm", concurrency=(8,), draft_lens=(0,))
    assert Candidate("x", "ar").knob_text() == "speculation off"


def test_help_imports_neither_pandas_nor_numpy():
    code = (
        "import sys\nfrom specsim.cli import build_parser\ntry:\n"
        "    build_parser().parse_args(['tune', '--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('numpy', 'pandas', 'torch') if m in sys.modules))\n"
    )
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.mark.slow  # fast suite under 5 min: over 2.5 s alone (CI runs it)
def test_trtllm_across_loads_gives_one_draft_len_schedule(trace, capsys):
    from specsim.analysis.tune.run import tuned_schedule

    cfg = TuneConfig(engine="trtllm", concurrency=(1, 8), requests=40, draft_lens=(1, 7),
                     gains=(0.04,))  # fmt: skip
    res = tune(trace, cfg)
    sched = res.extra["draft_len_schedule"]
    assert sched and [b for b, _ in sched] == sorted(b for b, _ in sched)
    assert tuple(map(tuple, sched)) == tuned_schedule(res.loads, "throughput")
    for lr in res.loads:
        tuned = [r for r in lr.rows if "tuned across" in r["candidate"]]
        assert len(tuned) == 1 and tuned[0]["policy"].startswith("trtllm-schedule:")
    args = ["tune", TRACE, "--engine", "trtllm", "--concurrency", "1,8", "--requests", "40",
            "--draft-lens", "1,7", "--gains", "0.04"]  # fmt: skip
    code, out, _ = _cli(args, capsys)
    assert code == 0 and "== across these loads" in out and "draft_len_schedule:" in out


@pytest.mark.slow
def test_workers_give_the_same_rows_as_one_process(trace):
    cfg = TuneConfig(engine="sglang", concurrency=(8,), requests=40, draft_lens=(1, 7))
    one = tune(trace, cfg).frame()
    two = tune(trace, TuneConfig(**{**cfg.as_dict(), "workers": 2})).frame()
    assert one.equals(two)
