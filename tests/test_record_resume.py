"""The generation stage keeps its work: per-request commits, partial prefixes, a locked cache."""

from __future__ import annotations

import json

import pytest
from record_tiny import torch

from specsim.record import generate
from specsim.record.generate import _partial_path, _read_cache, greedy_outputs, prompt_key


@pytest.fixture
def target():
    """A tiny random model whose greedy outputs wander (untied, wide init), with EOS = 95, a
    token it emits often: some requests stop early, some run to the budget."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specsim.record.models import Target

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=95,
                      pad_token_id=95, initializer_range=0.5)  # fmt: skip
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = 95
    return Target(model=model, tokenizer=None, name="t", sha256="0" * 64, device="cpu")


def _prompts() -> list[list[int]]:
    return [[1, 5 + i, 9, 11 + 2 * i, 20 + 3 * i] for i in range(6)]


def test_an_interrupted_batch_resumes_from_its_saved_prefixes(target, tmp_path, monkeypatch):
    prompts = _prompts()
    fresh = greedy_outputs(target, prompts, 24, batch_size=6, cache=tmp_path / "a.jsonl")

    cache = tmp_path / "b.jsonl"
    monkeypatch.setattr(generate, "CHECKPOINT_S", 0.0)  # save prefixes at every step

    class Killed(Exception):
        pass

    steps = {"n": 0}
    real = generate._Watch.__call__

    def dies_after_ten_steps(self, input_ids, scores, **kw):  # the process is killed mid-batch
        out = real(self, input_ids, scores, **kw)
        steps["n"] += 1
        if steps["n"] == 10:
            raise Killed
        return out

    monkeypatch.setattr(generate._Watch, "__call__", dies_after_ten_steps)
    with pytest.raises(Killed):
        greedy_outputs(target, prompts, 24, batch_size=6, cache=cache)
    saved = _read_cache(_partial_path(cache), "partial")
    committed = _read_cache(cache)
    unfinished = [k for k in map(prompt_key, prompts) if k not in committed]
    assert unfinished and all(len(saved[k]) == 10 for k in unfinished)  # 10 steps kept each

    monkeypatch.setattr(generate._Watch, "__call__", real)
    resumed = greedy_outputs(target, prompts, 24, batch_size=6, cache=cache)
    assert resumed == fresh  # the tiny model's greedy output is a function of its prefix
    lines = [json.loads(x) for x in cache.read_text().splitlines()]
    assert sorted(x["key"] for x in lines) == sorted(map(prompt_key, prompts))  # once each


def test_finished_requests_are_committed_before_their_batch_ends(target, tmp_path, monkeypatch):
    """A request that emits EOS is in the cache at once, even if the batch is then killed."""
    prompts = _prompts()
    full = greedy_outputs(target, prompts, 24, batch_size=6, cache=tmp_path / "a.jsonl")
    early = [o for o in full if len(o) < 24]
    assert early and len(early) < len(full)  # the fixture's point: both kinds in one batch
    cache = tmp_path / "b.jsonl"
    real = generate._Watch.__call__
    last = max(len(o) for o in early)

    def killed_late(self, input_ids, scores, **kw):
        out = real(self, input_ids, scores, **kw)
        if input_ids.shape[1] - self.width >= last + 1:
            raise KeyboardInterrupt
        return out

    monkeypatch.setattr(generate._Watch, "__call__", killed_late)
    with pytest.raises(KeyboardInterrupt):
        greedy_outputs(target, prompts, 24, batch_size=6, cache=cache)
    committed = _read_cache(cache)
    for p, o in zip(prompts, full, strict=True):
        if len(o) < 24:
            assert committed[prompt_key(p)] == o
