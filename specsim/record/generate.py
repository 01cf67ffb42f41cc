"""Greedy continuations of the target, batched and cached on disk (resumable).

Why cache: training a drafter and recording a trace both start from the target's own greedy
output; generation dominates their cost on a CPU, and a run that is interrupted restarts where it
stopped. The cache is an append-only JSONL per (target hash, max_new_tokens), one line per prompt
keyed by the hash of its token ids, so a half-written last line is simply ignored.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from specsim.progress import Progress
from specsim.record.models import Target, cache_dir


def prompt_key(ids: list[int]) -> str:
    return hashlib.sha1(json.dumps(ids).encode()).hexdigest()


def generation_cache(target: Target, max_new_tokens: int) -> Path:
    return cache_dir() / "generations" / f"{target.sha256[:16]}-n{max_new_tokens}.jsonl"


def _read_cache(path: Path) -> dict[str, list[int]]:
    done: dict[str, list[int]] = {}
    if path.exists():
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    obj = json.loads(line)
                    done[obj["key"]] = [int(t) for t in obj["out"]]
                except (json.JSONDecodeError, KeyError):
                    continue  # a torn last line from an interrupted run
    return done


def _strip(out: list[int], eos: tuple[int, ...]) -> list[int]:
    """Cut after the first EOS (kept: emitting it is part of the output)."""
    for i, t in enumerate(out):
        if t in eos:
            return out[: i + 1]
    return out


def left_pad(prompts: list[list[int]], pad: int):  # type: ignore[no-untyped-def]
    """(ids, attention mask) of a left-padded batch: what batched ``generate`` needs."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    return ids, mask


def greedy_batch(target: Target, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy outputs for a batch of prompts (left padding, KV cache), EOS kept."""
    import torch

    pad = target.eos_ids[0]
    ids, mask = left_pad(prompts, pad)
    with torch.no_grad():
        out = target.model.generate(
            input_ids=ids.to(target.device),
            attention_mask=mask.to(target.device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad,
            eos_token_id=list(target.eos_ids),
        )
    gen = out[:, ids.shape[1] :].cpu().tolist()
    return [_strip(g, target.eos_ids) for g in gen]


def greedy_outputs(
    target: Target,
    prompts: list[list[int]],
    max_new_tokens: int,
    batch_size: int = 16,
    cache: Path | None = None,
    desc: str = "generate",
) -> list[list[int]]:
    """Greedy output ids for every prompt, reusing and extending the on-disk cache."""
    cache = cache or generation_cache(target, max_new_tokens)
    cache.parent.mkdir(parents=True, exist_ok=True)
    done = _read_cache(cache)
    keys = [prompt_key(p) for p in prompts]
    todo = sorted(
        {k: i for i, k in enumerate(keys) if k not in done}.values(), key=lambda i: len(prompts[i])
    )
    with Progress(len(prompts), desc, " prompts") as bar:
        bar.update(len(prompts) - len(todo))
        for s in range(0, len(todo), batch_size):
            chunk = todo[s : s + batch_size]
            outs = greedy_batch(target, [prompts[i] for i in chunk], max_new_tokens)
            with open(cache, "a", encoding="utf-8") as fh:
                for i, o in zip(chunk, outs, strict=True):
                    done[keys[i]] = o
                    fh.write(json.dumps({"key": keys[i], "out": o}) + "\n")
            bar.update(len(chunk))
    return [done[k] for k in keys]


def cached_mask(target: Target, prompts: list[list[int]], max_new_tokens: int) -> list[bool]:
    """Which prompts already have a cached greedy output (to train on what exists)."""
    done = _read_cache(generation_cache(target, max_new_tokens))
    return [prompt_key(p) in done for p in prompts]


def describe(target: Any) -> str:
    return f"{target.name} ({target.sha256[:12]})"
