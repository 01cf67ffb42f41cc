"""Tiny random targets built from transformers configs (no downloads) for the record tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the record tests need torch (the record extra)")
transformers = pytest.importorskip("transformers", reason="the record tests need transformers")

VOCAB = 96
# one thread: on a shared, oversubscribed CPU two threads spin-wait and run ~100x slower
torch.set_num_threads(1)


def tiny_model(seed: int = 0, layers: int = 4):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    model = LlamaForCausalLM(cfg).eval()
    # sharpen the random LM so greedy outputs repeat (n-gram drafts then get accepted)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(8.0)
    model.generation_config.eos_token_id = 2
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def tiny_target(seed: int = 0):
    from specsim.record.models import Target

    class _Tok:
        chat_template = None

        def __call__(self, text):
            return {"input_ids": [3 + (ord(c) % (VOCAB - 3)) for c in text]}

    return Target(
        model=tiny_model(seed), tokenizer=_Tok(), name="tiny", sha256="0" * 64, device="cpu"
    )


def tiny_dir(path: Path, seed: int = 0) -> Path:
    """A Hugging Face model directory with a word-level tokenizer: loadable by --target."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model = tiny_model(seed)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for i in range(3, VOCAB):
        vocab[chr(ord("a") + (i - 3) % 26) + str((i - 3) // 26)] = i
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tk, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="</s>"
    )
    model.save_pretrained(path)
    fast.save_pretrained(path)
    return path


def prompts_file(path: Path, n: int) -> Path:
    words = [chr(ord("a") + i % 26) + str(i % 3) for i in range(40)]
    with open(path, "w") as fh:
        for i in range(n):
            fh.write(json.dumps({"turns": [" ".join(words[i : i + 6 + i % 4])]}) + "\n")
    return path
