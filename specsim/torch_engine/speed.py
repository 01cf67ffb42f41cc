"""The speed reference's probes for the real engine (``--clock ref``, :mod:`.clock`): a target
forward and each drafter's proposal, on buffers of their own. Kept apart from :mod:`.profile`
(which runs the engine) so that the engine can build one without importing the profiler.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from specsim.torch_engine.clock import LARGE, MID, SpeedRef
from specsim.torch_engine.target import FlatTarget


def _sync(model: Any) -> None:
    """Wait for queued GPU work so that wall-clock timings are real (no-op on CPU)."""
    if next(model.parameters()).is_cuda:
        torch.cuda.synchronize()


def _ids(gen: np.random.Generator, vocab: int, shape: Any) -> np.ndarray:
    """Random token ids, avoiding the first (special) ids."""
    return gen.integers(min(100, vocab // 2), vocab, shape)


def _fill(ft: FlatTarget, slot: int, ctx: int, gen: np.random.Generator, vocab: int) -> None:
    ft.reset(slot)
    for s in range(0, ctx, 256):
        ft.forward([slot], [_ids(gen, vocab, min(256, ctx - s)).tolist()])


def _forward_probe(
    model: Any, context: int, n: int, gen: np.random.Generator, vocab: int
) -> Callable[[], None]:
    """One target forward of ``n`` random tokens at ``context``, on a cache of its own."""
    ft = FlatTarget(model, 1, context + n + 1)
    _fill(ft, 0, context, gen, vocab)
    toks = _ids(gen, vocab, n).tolist()

    def forward() -> None:
        ft.forward([0], [toks])
        ft.truncate(0, context)
        _sync(model)

    return forward


def speed_reference(
    model: Any,
    drafters: dict[str, Any],
    every_s: float = 1.0,
    window: int = 1,
    context: int = 128,
    tokens: int = 4,
    seed: int = 7,
    probe: str = "warm",
    large_tokens: int = 0,
    large_every: int = 4,
    mid_tokens: int = 0,
    like: tuple[dict[str, float], dict[str, int]] | None = None,
) -> SpeedRef:
    """A :class:`SpeedRef` with a target probe (one forward of ``tokens`` tokens at
    ``context``, a typical verification) and one probe per drafter phase (its proposal for 2
    requests at the same anchor; a cheap drafter's call repeated to ~20 ms so that a timer
    tick is noise), the reference taken now. ``every_s`` (engine CPU seconds between
    re-timings) and ``window`` (probes in the median) set how fast it follows the machine;
    ``probe`` how each re-timing times a probe (``SpeedRef``). ``large_tokens`` > 0 adds a
    second target probe, one forward of that many tokens at ``context``, re-timed every
    ``large_every``-th calibration, towards which larger forwards are timed; ``mid_tokens`` > 0
    a third one of that many tokens, in between.
    The probes own their caches and buffers: they never touch an engine's state.
    ``like``: another process's ``(ref.ref_ms, ref.repeat_k)`` (same arguments): the same
    probes, that reference adopted instead of a new one taken (``SpeedRef.adopt``)."""
    gen = np.random.default_rng(seed)
    vocab = int(model.config.vocab_size)
    probes = {"target": _forward_probe(model, context, tokens, gen, vocab)}
    sizes = {"target": tokens}
    for name, n in ((LARGE, large_tokens), (MID, mid_tokens)):
        if n:
            probes[name] = _forward_probe(model, context, n, gen, vocab)
            sizes[name] = n
    repeat_k: dict[str, int] = {}
    for phase, proposer in drafters.items():
        n_feat = max(len(proposer.feature_layers) * int(model.config.hidden_size), 1)
        seq = torch.from_numpy(_ids(gen, vocab, (2, context + 1)))
        feat = torch.randn((2, context + 1, n_feat), generator=torch.Generator().manual_seed(seed))
        feat = feat.to(torch.float16)
        slots, anchors = np.arange(2), np.full(2, context)

        def once(proposer=proposer, seq=seq, feat=feat, slots=slots, anchors=anchors) -> None:
            proposer.propose(slots, anchors, seq, feat, 0.0, None)

        once()
        c0 = time.thread_time()
        once()
        k = max(1, int(np.ceil(0.02 / max(time.thread_time() - c0, 1e-6))))
        if like is not None:  # the same work as the reference's probe
            k = like[1].get(phase, k)
        repeat_k[phase] = k

        def draft(once=once, k=k) -> None:
            for _ in range(k):
                once()

        probes[phase] = draft
    ref = SpeedRef(
        probes, every_s=every_s, window=window, probe=probe, sizes=sizes, large_every=large_every
    )
    ref.repeat_k = repeat_k
    if like is not None:
        ref.adopt(like[0])
    else:
        ref.reference()
    return ref
