"""Teacher-forced target passes: features, greedy next tokens and top-k probabilities.

One forward of the target over ``prompt + output`` gives, for every position, the hidden states
the drafter conditions on (``target_layer_ids``, stored fp16 to halve memory), the target's greedy
next token (to check that it reproduces the generated output exactly), and the top-k of its
temperature-1 distribution (the soft target of the L1 loss term).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specsim.outputs import atomic
from specsim.record.models import Target


@dataclass(frozen=True, eq=False)
class Sequence:
    """One prompt + greedy output with its target-side tensors.

    ``feats[i]`` is the feature of sequence position ``start + i`` (earlier positions are beyond
    every anchor's context window and were dropped).
    """

    seq: torch.Tensor  # [N] long, prompt + output
    prompt_len: int
    start: int
    feats: torch.Tensor  # [N - start, n*H] fp16
    greedy: torch.Tensor  # [N] long, target argmax at each position (predicts position + 1)
    topk_ids: torch.Tensor | None  # [N, K] long
    topk_p: torch.Tensor | None  # [N, K] fp16
    category: str = ""

    @property
    def output_len(self) -> int:
        return int(self.seq.numel()) - self.prompt_len

    def first_mismatch(self) -> int:
        """Output index of the first token the teacher-forced target would not emit (or len)."""
        p = self.prompt_len
        pred = self.greedy[p - 1 : -1]
        bad = (pred != self.seq[p:]).nonzero()
        return int(bad[0]) if bad.numel() else self.output_len


@torch.no_grad()
def target_pass(
    target: Target,
    prompt: list[int],
    output: list[int],
    layer_ids: tuple[int, ...],
    window: int,
    topk: int = 0,
    category: str = "",
) -> Sequence:
    """Run the target once over prompt + output and keep what drafting and training need."""
    seq = torch.tensor(prompt + output, dtype=torch.long)
    out = target.model(
        input_ids=seq[None].to(target.device), output_hidden_states=True, use_cache=False
    )
    start = max(0, len(prompt) - 1 - window)
    hs = out.hidden_states
    if layer_ids:
        feats = torch.cat([hs[i + 1][0, start:] for i in layer_ids], -1).to(torch.float16).cpu()
    else:  # a drafter that needs no target features (n-gram)
        feats = torch.zeros((seq.numel() - start, 0), dtype=torch.float16)
    logits = out.logits[0].float()
    greedy = logits.argmax(-1).cpu()
    ids = probs = None
    if topk:
        p, ids = torch.softmax(logits, -1).topk(topk, -1)
        ids, probs = ids.cpu(), p.to(torch.float16).cpu()
    return Sequence(
        seq=seq,
        prompt_len=len(prompt),
        start=start,
        feats=feats,
        greedy=greedy,
        topk_ids=ids,
        topk_p=probs,
        category=category,
    )


def cached_target_pass(
    target: Target,
    prompt: list[int],
    output: list[int],
    layer_ids: tuple[int, ...],
    window: int,
    topk: int = 0,
    category: str = "",
) -> Sequence:
    """``target_pass`` memoised on disk (``<cache>/features/``), keyed by everything it reads.

    Why: on a CPU the teacher-forced pass costs about as much as generating; a recording that is
    restarted, or recorded again with another drafter of the same feature layers, reuses it.
    """
    import hashlib
    import json

    from specsim.record.models import cache_dir

    key = hashlib.sha1(
        json.dumps([target.sha256, prompt, output, list(layer_ids), window, topk]).encode()
    ).hexdigest()
    path = cache_dir() / "features" / f"{key}.pt"
    if path.exists():
        try:
            d = torch.load(path, weights_only=True)
            return Sequence(category=category, **d)
        except Exception:  # noqa: BLE001 - a torn file from an interrupted run: recompute
            pass
    s = target_pass(target, prompt, output, layer_ids, window, topk, category)
    path.parent.mkdir(parents=True, exist_ok=True)
    fields = ("seq", "prompt_len", "start", "feats", "greedy", "topk_ids", "topk_p")
    with atomic(path) as tmp:
        torch.save({f: getattr(s, f) for f in fields}, tmp)
    return s
