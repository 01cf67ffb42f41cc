"""What llama-server's ``--spec-type draft-dspark`` drafts and accepts at every position of given
outputs: the per-position table a draft-dspark trace of ``specsim validate --engine
llama-server`` is built from (``specsim.serve.llama_trace.build_trace``).

Why every position and not the server's own walk (``replay_llama_server``): the simulator
replays a trace under other loads and other timings, and a request's walk through its output
depends on what was accepted before; the trace must say what the server would draft wherever
the walk lands. The drafts are a deterministic function of the committed history (greedy
top-1 at every temperature, docs/llama-cpp-dspark.md point 14), so one teacher-forced target
pass over a request's output and one drafter pass over all its anchors give every position.
At T > 0 the server accepts a draft iff it equals the target's sample (point 15), so the same
walk over the server's sampled output is exact too.

The position rule is the server's (build 11434): at position n (n output tokens committed) the
anchor is ``output[n - 1]``; the block is ``--spec-draft-n-max`` N tokens long, decoded as a
block of N (:func:`specsim.record.dspark_export.with_block`); it is cut before the first raw
confidence under ``--spec-draft-p-min`` P, then to ``min(n_ctx_slot - n_tokens - 2,
n_remaining - 1)`` (``get_n_draft_max``); the leading drafts equal to the output are accepted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specsim.record.dspark_export import accepted_prefix, confidence_cut, with_block
from specsim.serve.ngram import Positions


def anchor_drafts(
    drafter: Any, feats: torch.Tensor, seq: torch.Tensor, prompt_len: int, start: int = 0
) -> tuple[list[list[int]], torch.Tensor]:
    """The block drafted after every output token but the last (anchor ``prompt_len + i`` is
    ``output[i]``): its token ids and raw confidences, one row per anchor."""
    n_out = int(seq.numel()) - prompt_len
    if n_out < 2:
        return [], torch.zeros((0, drafter.cfg.block_size))
    anchors = torch.arange(prompt_len, prompt_len + n_out - 1)
    drafts = drafter.draft(feats, seq, anchors, start=start)
    return drafts.tokens.tolist(), drafts.raw_conf


def walk_positions(
    tokens: list[list[int]],
    raw_conf: torch.Tensor,
    prompt_len: int,
    output: list[int],
    p_min: float = 0.0,
    n_ctx_slot: int = 1 << 30,
    eog_ids: tuple[int, ...] = (),
) -> Positions:
    """Every position's draft and acceptance from the anchors' blocks (:func:`anchor_drafts`):
    ``drafted[n]`` / ``accepted[n]`` / ``tokens[n]`` as :class:`specsim.serve.ngram.Positions`
    (position 0 is the prefill's and never drafts)."""
    length = len(output)
    n_max = int(raw_conf.shape[1])
    drafted = np.zeros(length, dtype=np.int64)
    accepted = np.zeros(length, dtype=np.int64)
    toks = np.full((length, max(n_max, 1)), -1, dtype=np.int64)
    keep = confidence_cut(raw_conf, p_min) if tokens else []
    for n in range(1, length):
        n_tokens = prompt_len + n - 1  # the slot's tokens before the sampled anchor
        cap = min(n_ctx_slot - n_tokens - 2, length - n - 1)
        if cap <= 0:
            continue
        d = tokens[n - 1][: min(keep[n - 1], cap)]
        if not d:
            continue  # a block cut to nothing: no speculation this step
        drafted[n] = len(d)
        toks[n, : len(d)] = d
        accepted[n] = accepted_prefix(d, output, n, eog_ids)
    return Positions(drafted=drafted, accepted=accepted, tokens=toks)


def settings_positions(
    requests: Sequence[tuple[Sequence[int], Sequence[int]]],
    settings: Sequence[tuple[int, float]],
    drafter_folder: str | Path,
    n_ctx_slot: int = 1 << 30,
    threads: int = 1,
    log: Callable[[str], None] | None = None,
) -> dict[tuple[int, float], list[Positions]]:
    """For each setting ``(N, P)`` (``--spec-draft-n-max``, ``--spec-draft-p-min``), the
    positions of every ``(prompt, output)`` request, in order. One SmolLM2 target (fp32, the
    copy ``replay_llama_server`` is checked with) and one pass over each request serve every
    setting; the drafter runs once per request and distinct N."""
    from specsim.record.draft_gguf import check_target
    from specsim.record.dspark import load_drafter
    from specsim.record.features import target_pass
    from specsim.record.models import load_target, set_threads

    set_threads(threads)
    folder = Path(drafter_folder)
    target = load_target("smollm2")
    check_target(folder, target.sha256)
    base = load_drafter(folder).float().eval().bind(target.model.get_input_embeddings())
    views = {n: with_block(base, n) for n in sorted({n for n, _ in settings})}
    found: dict[tuple[int, float], list[Positions]] = {s: [] for s in settings}
    for i, (prompt, output) in enumerate(requests):
        p, o = [int(t) for t in prompt], [int(t) for t in output]
        seq = target_pass(target, p, o, base.cfg.target_layer_ids, base.cfg.context_window)
        for n, drafter in views.items():
            toks, conf = anchor_drafts(drafter, seq.feats, seq.seq, len(p), seq.start)
            for s in settings:
                if s[0] == n:
                    pos = walk_positions(toks, conf, len(p), o, s[1], n_ctx_slot, target.eos_ids)
                    found[s].append(pos)
        if log is not None and ((i + 1) % 10 == 0 or i + 1 == len(requests)):
            log(f"  draft-dspark positions: {i + 1}/{len(requests)} requests")
    return found
