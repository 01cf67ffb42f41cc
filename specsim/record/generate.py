"""Greedy continuations of the target, batched and cached on disk (resumable).

Why cache: training a drafter and recording a trace both start from the target's own greedy
output; generation dominates their cost on a CPU (80-90% of a recording), and a run that is
interrupted restarts where it stopped. The cache is an append-only JSONL per (target hash,
max_new_tokens), one line per prompt keyed by the hash of its token ids, so a half-written last
line is simply ignored.

What a kill loses is bounded: a request is written to the cache the step it emits EOS (not when
its whole batch ends), and every ``CHECKPOINT_S`` seconds the unfinished requests' tokens so far
go to a sidecar ``.partial`` file; a resumed run continues each from its saved prefix (greedy
decoding is a function of the prefix, and the recorder's full target pass cuts any request at
the first token where batched and unbatched numerics disagree). Appends hold an exclusive lock,
so two runs sharing the cache never interleave lines. Progress counts tokens as they are made.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from specsim.progress import Progress
from specsim.record.models import Target, cache_dir


def prompt_key(ids: list[int]) -> str:
    return hashlib.sha1(json.dumps(ids).encode()).hexdigest()


def generation_cache(target: Target, max_new_tokens: int) -> Path:
    return cache_dir() / "generations" / f"{target.sha256[:16]}-n{max_new_tokens}.jsonl"


CHECKPOINT_S = 20.0  # unfinished requests' prefixes are saved this often


def _read_cache(path: Path, field: str = "out") -> dict[str, list[int]]:
    done: dict[str, list[int]] = {}
    if path.exists():
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    obj = json.loads(line)
                    done[obj["key"]] = [int(t) for t in obj[field]]
                except (json.JSONDecodeError, KeyError, TypeError, ValueError):
                    continue  # a torn last line from an interrupted run
    return done


def _partial_path(cache: Path) -> Path:
    return cache.with_name(cache.name + ".partial")


@contextlib.contextmanager
def _append(path: Path) -> Iterator[Any]:
    """Append under an exclusive lock: concurrent runs sharing a cache never interleave."""
    import fcntl

    with open(path, "a", encoding="utf-8") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield fh
            fh.flush()
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _write_lines(path: Path, field: str, items: list[tuple[str, list[int]]]) -> None:
    if items:
        with _append(path) as fh:
            for key, toks in items:
                fh.write(json.dumps({"key": key, field: [int(t) for t in toks]}) + "\n")


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


class _Watch:
    """A ``StoppingCriteria`` that never stops generation: it watches each decoding step to
    count tokens for the progress bar, commit every request that has just emitted EOS, and save
    the unfinished ones' prefixes every ``CHECKPOINT_S`` seconds."""

    def __init__(self, keys, starts, width, eos, cache, bar, limit) -> None:  # type: ignore[no-untyped-def]
        self.keys, self.starts, self.width, self.eos = keys, starts, width, set(eos)
        self.limit = limit
        self.cache, self.partial, self.bar = cache, _partial_path(cache), bar
        self.finished = [False] * len(keys)
        self.next_save = time.monotonic() + CHECKPOINT_S

    def _outs(self, input_ids) -> list[list[int]]:  # type: ignore[no-untyped-def]
        new = input_ids[:, self.width :].tolist()
        eos = tuple(self.eos)
        return [(self.starts[i] + _strip(o, eos))[: self.limit] for i, o in enumerate(new)]

    def __call__(self, input_ids, scores, **kwargs):  # type: ignore[no-untyped-def]
        import torch

        outs = self._outs(input_ids)
        fresh = [
            i
            for i, o in enumerate(outs)
            if not self.finished[i] and o and (o[-1] in self.eos or len(o) >= self.limit)
        ]
        _write_lines(self.cache, "out", [(self.keys[i], outs[i]) for i in fresh])
        for i in fresh:
            self.finished[i] = True
        if self.bar is not None:
            self.bar.update(sum(not f for f in self.finished) + len(fresh))
        if time.monotonic() >= self.next_save:
            todo = [(k, outs[i]) for i, k in enumerate(self.keys) if not self.finished[i]]
            _write_lines(self.partial, "partial", todo)
            self.next_save = time.monotonic() + CHECKPOINT_S
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def greedy_batch(
    target: Target,
    prompts: list[list[int]],
    max_new_tokens: int,
    *,
    starts: list[list[int]] | None = None,
    keys: list[str] | None = None,
    cache: Path | None = None,
    bar: Any = None,
) -> list[list[int]]:
    """Greedy outputs for a batch of prompts (left padding, KV cache), EOS kept.

    ``starts``: output tokens already made for each prompt (a resumed request continues from
    them); with ``keys`` and ``cache`` each request is committed the step it finishes.
    """
    import torch
    from transformers import StoppingCriteriaList

    starts = starts or [[] for _ in prompts]
    pad = target.eos_ids[0]
    ids, mask = left_pad([p + s for p, s in zip(prompts, starts, strict=True)], pad)
    budget = max_new_tokens - min(len(s) for s in starts)
    watch = None
    if keys is not None and cache is not None:
        watch = _Watch(keys, starts, ids.shape[1], target.eos_ids, cache, bar, max_new_tokens)
    with torch.no_grad():
        out = target.model.generate(
            input_ids=ids.to(target.device),
            attention_mask=mask.to(target.device),
            max_new_tokens=budget,
            do_sample=False,
            pad_token_id=pad,
            eos_token_id=list(target.eos_ids),
            stopping_criteria=StoppingCriteriaList([watch]) if watch else None,
        )
    gen = out[:, ids.shape[1] :].cpu().tolist()
    return [
        (s + _strip(g, target.eos_ids))[:max_new_tokens] for s, g in zip(starts, gen, strict=True)
    ]


def greedy_outputs(
    target: Target,
    prompts: list[list[int]],
    max_new_tokens: int,
    batch_size: int = 16,
    cache: Path | None = None,
    desc: str = "generate",
) -> list[list[int]]:
    """Greedy output ids for every prompt, reusing and extending the on-disk cache (module
    docstring: per-request commits, partial checkpoints, a lock, progress in tokens)."""
    cache = cache or generation_cache(target, max_new_tokens)
    cache.parent.mkdir(parents=True, exist_ok=True)
    done = _read_cache(cache)
    partial = _read_cache(_partial_path(cache), "partial")
    keys = [prompt_key(p) for p in prompts]
    todo = sorted(
        {k: i for i, k in enumerate(keys) if k not in done}.values(), key=lambda i: len(prompts[i])
    )
    # the bar counts output tokens: a request that stops early is credited its unused budget
    with Progress(len(prompts) * max_new_tokens, desc, " tok") as bar:
        bar.update((len(prompts) - len(todo)) * max_new_tokens)
        for s in range(0, len(todo), batch_size):
            chunk = todo[s : s + batch_size]
            starts = [partial.get(keys[i], [])[:max_new_tokens] for i in chunk]
            before = bar.n
            bar.update(sum(len(x) for x in starts))
            outs = greedy_batch(
                target, [prompts[i] for i in chunk], max_new_tokens, starts=starts,
                keys=[keys[i] for i in chunk], cache=cache, bar=bar,
            )  # fmt: skip
            committed = _read_cache(cache)
            _write_lines(cache, "out", [(keys[i], o) for i, o in zip(chunk, outs, strict=True)
                                        if keys[i] not in committed])  # fmt: skip
            for i, o in zip(chunk, outs, strict=True):
                done[keys[i]] = committed.get(keys[i], o)
            bar.update(len(chunk) * max_new_tokens - (bar.n - before))  # EOS: the unused budget
    return [done[k] for k in keys]


def cached_mask(target: Target, prompts: list[list[int]], max_new_tokens: int) -> list[bool]:
    """Which prompts already have a cached greedy output (to train on what exists)."""
    done = _read_cache(generation_cache(target, max_new_tokens))
    return [prompt_key(p) in done for p in prompts]


def describe(target: Any) -> str:
    return f"{target.name} ({target.sha256[:12]})"
