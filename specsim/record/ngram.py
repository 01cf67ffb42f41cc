"""A no-training baseline drafter: prompt lookup (n-gram matching) with its own confidence.

For an anchor at position a, the longest suffix of ``seq[..a]`` (length n down to 1) that occurred
earlier in the sequence is looked up; the tokens that followed its most recent occurrence are the
draft. Confidence of draft k: the share of ALL earlier occurrences of that suffix whose
continuation agreed with the draft at offsets 1..k, given it agreed before k (a vote; Laplace-
smoothed so one occurrence gives 2/3, not 1). With no match, the anchor is repeated with
confidence 0.02. Deterministic, so verification treats it as a one-hot q: always lossless.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NO_MATCH_CONF = 0.02


@dataclass(frozen=True)
class NgramConfig:
    block_size: int = 7
    n: int = 3
    target_layer_ids: tuple[int, ...] = ()  # needs no target features
    context_window: int = 0
    sts_temperatures: tuple[float, ...] | None = None


def lookup(seq: np.ndarray, a: int, n: int, g: int) -> tuple[np.ndarray, np.ndarray]:
    """Draft (g,) and conditional confidences (g,) after anchor position ``a`` of ``seq``."""
    hist = seq[: a + 1]
    for m in range(min(n, a), 0, -1):
        suffix = hist[a + 1 - m :]
        # windows of length m ending strictly before a (start i, continuation at i + m)
        win = np.lib.stride_tricks.sliding_window_view(hist[:a], m)
        hits = np.flatnonzero((win == suffix).all(axis=1))
        if hits.size == 0:
            continue
        cont_start = hits + m
        best = cont_start[-1]
        draft = np.full(g, hist[-1], dtype=np.int64)
        avail = hist[best : best + g]
        draft[: avail.size] = avail
        conf = np.empty(g)
        alive = np.ones(hits.size, dtype=bool)
        for k in range(g):
            pos = cont_start + k
            ok = pos < a + 1
            agree = alive & ok
            agree[ok] &= hist[pos[ok]] == draft[k]
            conf[k] = (agree.sum() + 1.0) / (alive.sum() + 2.0) if k < avail.size else 0.02
            alive = agree
        return draft, conf
    return np.full(g, hist[-1], dtype=np.int64), np.full(g, NO_MATCH_CONF)


class NgramDrafter:
    """Prompt-lookup drafter with the DSpark drafter's ``draft`` interface."""

    def __init__(self, n: int = 3, block_size: int = 7) -> None:
        self.cfg = NgramConfig(block_size=block_size, n=n)

    def draft(self, feats, seq, anchors, temperature=0.0, generator=None, chunk=0, start=0):  # type: ignore[no-untyped-def]
        import torch

        from specsim.record.dspark import Drafts

        s = seq.numpy()
        out = [lookup(s, int(a), self.cfg.n, self.cfg.block_size) for a in anchors]
        toks = torch.from_numpy(np.stack([o[0] for o in out]))
        conf = torch.from_numpy(np.stack([o[1] for o in out])).float()
        return Drafts(tokens=toks, conf=conf, raw_conf=conf, q=None)
