"""``specsim profile build`` and ``profile show`` take bad input loudly: each class a hostile-input
corpus found, through the real CLI. A refusal is exit 2, one line naming the flag or field and
the fix, no traceback, and nothing written to ``--out``.

1. a Hugging Face config.json: non-finite, fractional, out-of-range or inconsistent numbers
   (KV heads, heads against the hidden size, dense layers against layers, top-k against
   experts), JSON nested too deep, a FIFO, a folder, a huge file; a valid Qwen3-4B-like config
   (heads x head_dim != hidden) still builds;
2. a deployment whose weights leave under one token of KV cache is refused at build time;
3. ``--drafter``: digits that are not ASCII, a key given twice, numbers out of range; the
   drafter's weights count against GPU memory;
4. ``--tp``/``--ep``/``--dp`` bounded where parsed, naming the flag; a realistic large --dp builds;
5. ``profile show`` of a folder says it is a folder and what to pass;
6. the words for steps past a table's end match what the cost model does (held flat or linear);
7. spellings users expect: Hugging Face repo ids and Llama 3.1 / 3.3 names of the built-ins,
   SXM spellings of the GPUs; a GPU without figures (H100 PCIe) is refused naming the nearest.
"""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import numpy as np
import pytest
from test_reliability_v4_profile import refused

from specsim.cli import main
from specsim.sim.cost.model import CostModel
from specsim.sim.cost.profiles import get_profile

LLAMA_8B = {
    "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
}  # fmt: skip
MOE = {**LLAMA_8B, "num_experts": 64, "num_experts_per_tok": 4, "moe_intermediate_size": 1408}


def build_argv(model, out: Path, *extra: str) -> list[str]:  # type: ignore[no-untyped-def]
    return ["profile", "build", "--model", str(model), "--out", str(out), *extra]


@pytest.fixture
def dirs(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "out").mkdir()
    return tmp_path / "in", tmp_path / "out"


def config(folder: Path, cfg: dict | str, name: str = "config.json") -> Path:
    p = folder / name
    p.write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    return p


# ---- 1. a Hugging Face config.json


@pytest.mark.parametrize(
    "cfg, words",
    [
        (json.dumps(LLAMA_8B).replace("4096", "Infinity", 1), ["hidden_size", "inf"]),
        (json.dumps(LLAMA_8B).replace("4096", "NaN", 1), ["hidden_size", "nan"]),
        ({**LLAMA_8B, "num_hidden_layers": 32.5}, ["num_hidden_layers", "whole number"]),
        ({**LLAMA_8B, "vocab_size": 10**30}, ["vocab_size", "whole number"]),
        ({**LLAMA_8B, "hidden_size": "4096"}, ["hidden_size", "JSON number"]),
        ({**LLAMA_8B, "num_attention_heads": True}, ["num_attention_heads", "not a number"]),
        ("[" * 100_000 + "]" * 100_000, ["not a readable JSON", "nested too deep"]),
        ('{"hidden_size": ' + "9" * 5000 + "}", ["not a readable JSON"]),
        ({**LLAMA_8B, "hidden_size": 1024, "num_attention_heads": 2048, "num_key_value_heads": 8},
         ["num_attention_heads = 2048", "hidden_size = 1024", "head_dim"]),
        ({**LLAMA_8B, "num_key_value_heads": 0}, ["num_key_value_heads", "[1, "]),
        ({**LLAMA_8B, "num_key_value_heads": 64}, ["num_key_value_heads = 64", "must divide"]),
        ({**LLAMA_8B, "num_key_value_heads": 5}, ["num_key_value_heads = 5", "must divide"]),
        ({**LLAMA_8B, "head_dim": 0}, ["head_dim", "[1, "]),
        ({**MOE, "first_k_dense_replace": 100}, ["first_k_dense_replace = 100", "32 layers"]),
        ({**MOE, "num_experts_per_tok": 65}, ["num_experts_per_tok = 65", "[1, 64]"]),
        ({**MOE, "num_experts_per_tok": 0}, ["num_experts_per_tok = 0"]),
        ({**MOE, "mlp_only_layers": [0, 40]}, ["mlp_only_layers", "40"]),
        ({**LLAMA_8B, "tie_word_embeddings": "false"}, ["tie_word_embeddings", "true or false"]),
        ([LLAMA_8B], ["not a JSON object"]),
    ],
)  # fmt: skip
def test_a_bad_hf_config_is_one_line_naming_the_field(dirs, capsys, cfg, words):
    src, out = dirs
    line = refused(capsys, build_argv(config(src, cfg), out / "p.csv"), out, *words)
    assert "--model" in line


def test_an_moe_whose_dense_layers_outnumber_its_layers_writes_nothing(dirs, capsys):
    """It printed negative terms (-52 GB of weights per GPU) and wrote a profile that replayed."""
    src, out = dirs
    cfg = config(src, {**MOE, "n_routed_experts": 64, "first_k_dense_replace": 33})
    refused(capsys, build_argv(cfg, out / "p.csv"), out, "first_k_dense_replace = 33")


def test_a_qwen3_4b_config_whose_heads_times_head_dim_is_not_hidden_builds(dirs, capsys):
    """Qwen3-4B: 32 heads x 128 = 4,096 over a hidden size of 2,560: valid, given head_dim."""
    src, out = dirs
    cfg = config(src, {"hidden_size": 2560, "num_hidden_layers": 36, "num_attention_heads": 32,
                       "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 9728,
                       "vocab_size": 151936, "tie_word_embeddings": True})  # fmt: skip
    assert main(build_argv(cfg, out / "q.csv")) == 0
    prof = get_profile(str(out / "q.csv"))
    assert prof.kv_tokens > 1000 and prof.step_time(256) > prof.step_time(1) > 0


def test_a_mixtral_config_takes_intermediate_size_as_the_expert_width(dirs, capsys):
    src, out = dirs
    cfg = {**LLAMA_8B, "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000}
    assert main(build_argv(config(src, cfg), out / "m.csv", "--tp", "4")) == 0
    assert "moe" in capsys.readouterr().out


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_as_the_model_is_refused_not_waited_on(dirs, capsys):
    src, out = dirs
    fifo = src / "config.json"
    os.mkfifo(fifo)
    old = signal.signal(signal.SIGALRM, lambda *_: pytest.fail("blocked reading a FIFO"))
    signal.alarm(20)
    try:
        refused(capsys, build_argv(fifo, out / "p.csv"), out, "not a regular file")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_a_folder_or_a_huge_file_as_the_model_is_refused(dirs, capsys):
    src, out = dirs
    refused(capsys, build_argv(src, out / "p.csv"), out, "is a folder", "config.json")
    huge = config(src, " " * (5 << 20) + json.dumps(LLAMA_8B), "big.json")
    refused(capsys, build_argv(huge, out / "p.csv"), out, "over 4 MiB")


# ---- 2. no room for the KV cache


def test_weights_that_leave_under_one_token_of_kv_are_refused(dirs, capsys):
    """A model whose KV per token is as large as its weights (head_dim 4,096 over a hidden
    size of 1): 47 GB of FP8 weights leave ~23 GB on an H100, under one 47 GB token. It was
    written as kv_tokens 1, and replay then blamed a --kv-tokens flag never given."""
    src, out = dirs
    cfg = config(src, {"hidden_size": 1, "num_hidden_layers": 700, "num_attention_heads": 4096,
                       "num_key_value_heads": 4096, "head_dim": 4096, "intermediate_size": 1,
                       "vocab_size": 1})  # fmt: skip
    argv = build_argv(cfg, out / "p.csv", "--weight-dtype", "fp8")
    refused(capsys, argv, out, "does not fit", "under one token", "1 x H100-SXM", "--tp",
            "--weight-dtype", "more memory")  # fmt: skip


# ---- 3. --drafter


@pytest.mark.parametrize(
    "spec, words",
    [
        ("dspark:layers=\u00b3", ["layers = '\u00b3'", "digits 0-9"]),
        ("dspark:block=\u0663", ["block = '\u0663'", "digits 0-9"]),
        ("mtp:\u00b2", ["mtp:N", "digits 0-9"]),
        ("dspark:layers=5,block=7,layers=6", ["layers twice"]),
        ("dspark:width=10000000", ["width", "[64, "]),
        ("dspark:layers=10000000", ["layers", "[1, 64]"]),
        ("dspark:vocab=10000000", ["vocab", "[1, "]),
        ("dspark:features=33", ["features", "[1, 32]"]),
        ("dspark:block=0", ["block", "[1, 64]"]),
    ],
)
def test_a_bad_drafter_spec_is_one_line(dirs, capsys, spec, words):
    _, out = dirs
    argv = build_argv("llama-3-8b", out / "p.csv", "--drafter", spec)
    refused(capsys, argv, out, "--drafter", *words)


def test_the_drafters_weights_count_against_gpu_memory(dirs, capsys):
    _, out = dirs
    big = "dspark:layers=8,width=16384"  # ~80 GB of drafter beside an 8B target
    refused(capsys, build_argv("llama-3-8b", out / "p.csv", "--drafter", big), out,
            "does not fit", "GB of drafter", "--drafter")  # fmt: skip
    assert main(build_argv("llama-3-8b", out / "none.csv")) == 0
    assert main(build_argv("llama-3-8b", out / "ds.csv", "--drafter", "dspark:layers=5")) == 0
    assert "GB drafter" in capsys.readouterr().out
    none, ds = get_profile(str(out / "none.csv")), get_profile(str(out / "ds.csv"))
    # 5 layers shaped like the target's + a 5-feature projection: ~1.17B BF16 parameters
    # = 2.35 GB, at 131,072 bytes of KV a token ~17,900 tokens fewer
    assert 17_000 < none.kv_tokens - ds.kv_tokens < 19_000


# ---- 4. --tp / --ep / --dp


@pytest.mark.parametrize("flag", ["--tp", "--ep", "--dp"])
@pytest.mark.parametrize("value", ["0", "1025", "1e9", "2.5", "inf"])
def test_parallel_degrees_are_bounded_where_parsed(dirs, capsys, flag, value):
    _, out = dirs
    refused(capsys, build_argv("llama-3-8b", out / "p.csv", flag, value), out, f"argument {flag}")


def test_a_large_dp_builds_instead_of_naming_a_header(dirs, capsys):
    """DP 123 failed naming the profile's batch_tokens; the table now stops at the million
    tokens a profile covers (the eager steps beyond are linear: extrapolated)."""
    _, out = dirs
    assert main(build_argv("llama-3-8b", out / "p.csv", "--dp", "123")) == 0
    prof = get_profile(str(out / "p.csv"))
    assert prof.gpus == 123 and prof.b_max <= 1_000_000 and prof.max_running == 256 * 123


# ---- 5. profile show of a folder


def test_profile_show_of_a_folder_says_what_to_pass(dirs, capsys, monkeypatch):
    src, out = dirs
    refused(capsys, ["profile", "show", src], None, "is a folder", "holds none")
    (src / "a.csv").write_text("batch_tokens,step_ms\n1,5\n8,6\n")
    refused(capsys, ["profile", "show", src], None, "is a folder", "a.csv")
    assert main(["profile", "export", "v4-pro-16xh20", "--out", str(out / "tables")]) == 0
    capsys.readouterr()
    refused(capsys, ["profile", "show", out / "tables"], None, "is a folder",
            "profile import vllm-adaptive", "verify_cost.csv")  # fmt: skip
    monkeypatch.chdir(out)  # a bare folder name, no path separator
    refused(capsys, ["profile", "show", "tables"], None, "is a folder")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_profile_show_of_a_fifo_is_refused(dirs, capsys):
    src, _ = dirs
    os.mkfifo(src / "p.csv")
    refused(capsys, ["profile", "show", src / "p.csv"], None, "not a regular file")


# ---- 6. past the table's end


def test_the_words_for_steps_past_the_table_match_what_is_charged():
    falling = CostModel("f", np.array([1, 2, 4]), np.array([5.0, 4.0, 3.0]))
    rising = CostModel("r", np.array([1, 2, 4]), np.array([3.0, 4.0, 5.0]))
    assert falling.step_time(100) == pytest.approx(3e-3)  # held flat
    assert "held flat" in falling.beyond_table() and "linear" not in falling.beyond_table()
    assert rising.step_time(6) == pytest.approx(6e-3)  # the last segment's line
    assert rising.beyond_table() == "extrapolated linearly from the last two points"


def test_a_replay_past_a_falling_table_warns_that_it_holds_flat():
    from specsim.sim.simulate import replay

    falling = CostModel("f", np.array([1, 2, 4]), np.array([5.0, 4.0, 3.0]))
    with pytest.warns(UserWarning, match="covers token batches up to 4") as rec:
        replay("synthetic-chat", "static:3", concurrency=4, requests=16, profile=falling)
    said = " ".join(str(w.message) for w in rec if "covers token batches" in str(w.message))
    assert "held flat" in said and "linearly" not in said


# ---- 7. names users expect


def _step(out: Path, name: str) -> float:
    return float(get_profile(str(out / name)).step_time(64))


@pytest.mark.parametrize(
    "spelling", ["meta-llama/Llama-3.3-70B-Instruct", "llama-3.3-70b", "Llama3.1-70B"]
)
def test_hf_repo_ids_and_llama_3_x_names_are_the_builtin(dirs, capsys, spelling):
    _, out = dirs
    assert main(build_argv("llama-3-70b", out / "ref.csv", "--tp", "4")) == 0
    assert main(build_argv(spelling, out / "alias.csv", "--tp", "4")) == 0
    assert _step(out, "alias.csv") == _step(out, "ref.csv")
    assert "same architecture" in get_profile(str(out / "alias.csv")).meta["model_source"]


def test_an_unknown_model_lists_the_names_and_repo_ids(dirs, capsys):
    _, out = dirs
    refused(capsys, build_argv("llama-3.2-1b", out / "p.csv"), out, "unknown model",
            "llama-3-70b", "repo ids")  # fmt: skip


def test_gpu_spellings_and_a_gpu_without_figures(dirs, capsys):
    _, out = dirs
    assert main(build_argv("llama-3-8b", out / "a.csv", "--gpu", "h100")) == 0
    assert main(build_argv("llama-3-8b", out / "b.csv", "--gpu", "NVIDIA H100 SXM5")) == 0
    assert _step(out, "a.csv") == _step(out, "b.csv")
    (out / "a.csv").unlink()
    (out / "b.csv").unlink()
    capsys.readouterr()
    refused(capsys, build_argv("llama-3-8b", out / "p.csv", "--gpu", "h100-pcie"), out,
            "unknown GPU", "H100 PCIe", "2.0 TB/s", "nearest: H100", "profile import")  # fmt: skip


# ---- the bill's columns count what their rows price (tokens for the target, requests for the
# drafter); a decode step without the drafter, a speculative step of R requests x (k + 1)
def test_the_bill_prices_decode_and_speculative_steps_in_their_own_columns():
    from specsim.sim.cost import build as bd
    from specsim.sim.cost.build_profile import bill
    from specsim.sim.cost.models import builtin_model

    dep = bd.Deployment(model=builtin_model("llama-3-8b"), gpu="h100", engine="vllm",
                        drafter="dspark:layers=5,block=7")  # fmt: skip
    _, text = bill(dep)
    lines = text.splitlines()
    dec = next(i for i, ln in enumerate(lines) if ln.strip().startswith("decode (ms)"))
    spec = next(i for i, ln in enumerate(lines) if ln.strip().startswith("speculative (ms)"))
    assert "256 req = 256 tok" in lines[dec] and "32 req x 8 = 256 tok" in lines[spec]
    assert not any("drafter" in ln for ln in lines[dec:spec])  # no drafting without speculation

    def row(name: str) -> list[float]:
        ln = next(x for x in lines[spec:] if x.strip().startswith(name))
        ln = re.sub(r"\([^)]*\)", "", ln)  # the mids: ranges in parentheses dropped
        return [float(v) for v in ln.split()[-3:]]

    verify, draft, total = row("target verify"), row("drafter (dspark)"), row("speculative step")
    assert total == pytest.approx([v + d for v, d in zip(verify, draft, strict=True)], abs=2e-3)
