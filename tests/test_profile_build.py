"""``specsim profile build``: a profile priced from Vidur's measured operator times.

The checks: the curves reproduce the HELD-OUT models' measured linear ops (CodeLlama-34b,
internlm-20b, phi-2 on H100 and A100; Llama-3-8B/70B on A100) within the stated tolerance; a
built profile is monotone, prices a 256-token verify clearly above a 1-token decode (unlike the
roofline), replays, halves its weights under TP 2 while adding an all-reduce; bad input is one
line and exit 2.
"""

from __future__ import annotations

import json
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
from specsim.sim.cost.profiles import get_profile

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


def test_built_8b_is_monotone_and_verify_costs_more_than_the_roofline_says():
    model, _, _ = build(_dep())
    b = np.arange(1, 40000)
    assert np.all(np.diff(model.step_time(b)) >= 0)
    ratio = model.step_time(256) / model.step_time(1)
    roof = get_profile("h100-dense-8b")
    roof_ratio = roof.step_time(256) / roof.step_time(1)
    # found: 1.43 built vs 1.13 roofline (the table: weights, attention ops, LM head)
    assert ratio > 1.3 and ratio > roof_ratio + 0.2
    # the drafter is priced by its architecture: ~1.3 ms at one request, not 0.36
    assert 0.8 < model.draft_ms(1, 7) < 3.0 and model.draft_ms(1, 7) > roof.draft_ms(1, 7) * 2


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
