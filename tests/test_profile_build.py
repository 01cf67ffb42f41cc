"""``specsim profile build``: a profile priced from Vidur's measured operator times.

The checks: the curves reproduce the HELD-OUT models' measured linear ops (CodeLlama-34b,
internlm-20b, phi-2 on H100 and A100; Llama-3-8B/70B on A100) within the stated tolerance; a
built profile is monotone, prices a 256-token verify clearly above a 1-token decode, replays,
halves its weights under TP 2 while adding an all-reduce; bad input is one line and exit 2; each
built-in deployment is its ``profile build`` line, and the retired roofline names are refused.
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from specsim.cli import main
from specsim.sim.cost.build import Deployment, step_terms
from specsim.sim.cost.build_profile import bill, build
from specsim.sim.cost.models import model_arch
from specsim.sim.cost.operators import curves
from specsim.sim.cost.profiles import BUILT, RETIRED, build_line, get_profile, read_profile_csv

HELDOUT = Path(__file__).parent / "data" / "vidur_heldout_linear.csv"  # Vidur, MIT (see its README)


def _heldout_errors(gpu: str, reference: str | None) -> np.ndarray:
    with HELDOUT.open("r") as fh:
        h = pd.read_csv(fh)
    x = h[(h.gpu == gpu) & (h.tokens <= 4096)]
    pred = curves(gpu, "bf16", reference).gemm_s(x.tokens.to_numpy(), 2.0 * x.k * x.n)
    return np.abs(pred / (x.ms.to_numpy() * 1e-3) - 1.0)


@pytest.mark.parametrize(
    ("gpu", "reference", "median", "p90"),
    [("h100", None, 0.08, 0.20), ("a100", None, 0.08, 0.20), ("a100", "h100", 0.12, 0.25)],
)
def test_curves_reproduce_heldout_models(gpu, reference, median, p90):
    """Fit on Llama-2-7b/70b and Qwen-72B; held-out models within median / p90 |rel. error|
    (found: H100 4.9% / 15%, A100 4.2% / 14%, H100 carried to A100 by the rule 8.2% / 17%)."""
    e = _heldout_errors(gpu, reference)
    assert e.size > 300
    assert np.median(e) < median and np.quantile(e, 0.9) < p90


def _dep(**kw) -> Deployment:
    base = {"model": model_arch("llama-3-8b"), "gpu": "H100", "drafter": "dspark:layers=5,block=7"}
    return Deployment(**{**base, **kw})


def test_built_8b_is_monotone_and_verify_costs_clearly_more_than_a_decode():
    # The retired roofline (h100-dense-8b) put this ratio at 1.13 and the drafter at 0.36 ms;
    # what stays is the built profile's own claim: a verify of 256 tokens is clearly dearer
    # than a 1-token decode, and the drafter is priced by its architecture.
    model, _, _ = build(_dep())
    b = np.arange(1, 40000)
    assert np.all(np.diff(model.step_time(b)) >= 0)
    ratio = model.step_time(256) / model.step_time(1)
    # found: 1.43 (the table: weights, attention ops, LM head)
    assert ratio > 1.3
    # the drafter is priced by its architecture (5 layers of width 4096): ~2 ms at one request
    assert 0.8 < model.draft_ms(1, 7) < 3.0


def test_tp2_halves_the_weights_and_adds_an_all_reduce():
    one = build(_dep())[1]
    two = build(_dep(tp=2))[1]
    t1, t2 = step_terms(one, [1, 64]), step_terms(two, [1, 64])
    assert np.all(t1["all-reduce"] == 0) and np.all(t2["all-reduce"] > 0)
    assert np.all((t2["weights"] / t1["weights"] > 0.45) & (t2["weights"] / t1["weights"] < 0.65))
    assert build(_dep(tp=2))[0].kv_tokens > 2 * build(_dep())[0].kv_tokens  # half the weights


def test_moe_and_other_gpus_build():
    """An MoE on 8 GPUs with EP, an fp8 Qwen on an MI300X, mtp and ngram drafters."""
    v4, _, _ = build(Deployment(model_arch("deepseek-v4-flash"), "B300", tp=4, ep=4,
                                drafter="mtp:1"))  # fmt: skip
    assert v4.gpus == 4 and v4.step_time(256) > v4.step_time(1)
    q, _, _ = build(Deployment(model_arch("qwen3-32b"), "MI300X", weight_dtype="fp8",
                               drafter="ngram", engine="sglang"))  # fmt: skip
    assert q.draft_ms(4, 7) == pytest.approx(0.04)


def test_build_writes_a_profile_that_replays(tmp_path, capsys):
    out = tmp_path / "built.csv"
    argv = ["profile", "build", "--model", "llama-3-8b", "--gpu", "h100", "--tp", "1",
            "--engine", "vllm", "--drafter", "dspark:layers=5,block=7",
            "--out", str(out)]  # fmt: skip
    t0 = time.perf_counter()
    assert main(argv) == 0
    took = time.perf_counter() - t0
    printed = capsys.readouterr().out
    assert "weights" in printed and "assumed:" in printed and "(0." in printed
    print(f"profile build took {took:.2f} s")  # measured, not asserted (< 2 s found: ~0.5 s)
    assert main(["replay", "chat", "--profile", str(out), "--concurrency", "8", "--requests",
                 "40", "--json"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_hf_config_is_read(tmp_path):
    cfg = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256}  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    mine = build(_dep(model=model_arch(str(path))))[0]
    ref = build(_dep())[0]
    assert mine.step_time(64) == pytest.approx(ref.step_time(64))


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--model", "llama-3-8b", "--gpu", "tpu"], "unknown GPU"),
        (["--model", "gpt-5"], "unknown model"),
        (["--model", "llama-3-8b", "--tp", "3"], "does not divide"),
        (["--model", "llama-3-70b"], "does not fit"),
        (["--model", "llama-3-8b", "--drafter", "eagle:3"], "unknown --drafter"),
        (["--model", "llama-3-8b", "--drafter", "dspark:layers=x"], "key=N"),
        (["--model", "llama-3-8b", "--ep", "2"], "expert parallelism"),
        (["--model", "BAD_JSON"], "not a readable JSON"),
    ],
)
def test_hostile_inputs_are_one_line_exit_2(tmp_path, capsys, args, words):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    args = [str(bad) if a == "BAD_JSON" else a for a in args]
    assert main(["profile", "build", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0]


def test_bill_names_each_term():
    _, text = bill(_dep(tp=2))
    for term in ("weights", "attention", "all-reduce", "lm head", "sampling", "engine overhead",
                 "drafter (dspark)", "kv read"):  # fmt: skip
        assert term in text


@pytest.mark.parametrize(("retired", "replacement"), sorted(RETIRED.items()))
def test_retired_roofline_names_are_refused_naming_the_replacement(capsys, retired, replacement):
    argv = ["replay", "synthetic-chat", "--profile", retired, "--concurrency", "4",
            "--requests", "10"]  # fmt: skip
    assert main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1, captured.err
    assert retired in err[0] and repr(replacement) in err[0]
    assert replacement in BUILT


@pytest.mark.parametrize("name", sorted(BUILT))
def test_builtin_name_is_its_profile_build_line(tmp_path, capsys, name):
    """``get_profile(NAME)`` equals what ``specsim profile build`` with BUILT's flags writes (the
    CSV keeps 6 significant digits, hence rtol 1e-5)."""
    out = tmp_path / f"{name}.csv"
    line = build_line(BUILT[name][1])
    assert line.startswith("specsim profile build ")
    assert main([*shlex.split(line)[1:], "--out", str(out)]) == 0
    capsys.readouterr()
    built, mine = read_profile_csv(out), get_profile(name)
    assert mine.meta["built_as"] == line
    np.testing.assert_array_equal(built.batch_tokens, mine.batch_tokens)
    np.testing.assert_allclose(built.step_ms, mine.step_ms, rtol=1e-5, atol=0)
    assert built.draft_curve and mine.draft_curve
    assert [r for r, _ in built.draft_curve] == [r for r, _ in mine.draft_curve]
    np.testing.assert_allclose([m for _, m in built.draft_curve],
                               [m for _, m in mine.draft_curve], rtol=1e-5)  # fmt: skip
    for key in ("max_running", "kv_tokens", "max_batched_tokens", "gpus"):
        assert getattr(built, key) == getattr(mine, key), key
