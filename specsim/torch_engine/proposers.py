"""Drafting for the real engine: one block of gamma draft tokens per running request, batched.

A proposer sees the engine's per-slot buffers (token ids and target features of every committed
position) and returns, for each request, its draft tokens, the conditional confidences c_k the
policy schedules on, and (when sampling) the draft distribution q each token was drawn from.

``DSparkProposer`` runs the DSpark backbone once per request (each request attends to its own
target-feature window) and then the Markov and confidence heads for ALL requests at once, position
by position: the heads (the LM head above all) are most of a draft's cost, so that is where
batching pays. It reproduces ``DSparkDrafter.draft`` (the recorder's drafting) exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch


@dataclass(frozen=True, eq=False)
class Proposal:
    """Drafts of R requests: ``tokens`` (R, gamma) target ids, ``conf`` (R, gamma) in [0, 1],
    ``q`` (R, gamma, V) draft probabilities over the target vocabulary (sampling only)."""

    tokens: np.ndarray
    conf: np.ndarray
    q: torch.Tensor | None = None


class Proposer(Protocol):
    """What the engine needs from a drafter."""

    gamma: int
    feature_layers: tuple[int, ...]

    def propose(
        self,
        slots: np.ndarray,
        anchors: np.ndarray,
        seq_buf: torch.Tensor,
        feat_buf: torch.Tensor,
        temperature: float,
        generator: torch.Generator | None,
    ) -> Proposal:
        """Drafts after ``anchors[i]`` (the position of the last committed token) of slot
        ``slots[i]``; ``seq_buf[s, :anchor+1]`` holds its tokens and ``feat_buf[s, :anchor]`` the
        target features strictly before the anchor."""
        ...


class DSparkProposer:
    """A trained (or untrained) :class:`specsim.record.dspark.DSparkDrafter` as a proposer."""

    def __init__(self, drafter: Any, target_model: Any) -> None:
        drafter.bind(target_model.get_input_embeddings())
        self.drafter = drafter
        self.gamma = int(drafter.cfg.block_size)
        self.feature_layers = tuple(int(i) for i in drafter.cfg.target_layer_ids)
        self.vocab = int(drafter.cfg.vocab_size)

    @torch.no_grad()
    def propose(self, slots, anchors, seq_buf, feat_buf, temperature, generator) -> Proposal:  # type: ignore[no-untyped-def]
        d = self.drafter
        dev = seq_buf.device
        hs = [
            d.backbone(feat_buf[s], seq_buf[s], torch.tensor([int(a)], device=dev), start=0)
            for s, a in zip(slots.tolist(), anchors.tolist(), strict=True)
        ]
        h = torch.cat(hs)  # [R, gamma, H]
        prev = seq_buf[torch.as_tensor(slots, device=dev), torch.as_tensor(anchors, device=dev)]
        drafts = d.markov_walk(h, prev, temperature, generator)  # the recorder's loop, shared
        q_full = None
        if drafts.q is not None:
            qd = drafts.q.cpu()  # [R, gamma, V_draft]
            q_full = torch.zeros((*qd.shape[:2], self.vocab), dtype=qd.dtype)
            q_full[..., d.d2t.cpu()] = qd
        return Proposal(
            tokens=drafts.tokens.cpu().numpy().astype(np.int64),
            conf=drafts.conf.cpu().numpy().astype(np.float64),
            q=q_full,
        )


class NgramProposer:
    """Prompt lookup (:mod:`specsim.record.ngram`): no target features, deterministic drafts.

    Deterministic drafts are a one-hot q, so rejection sampling accepts draft x with probability
    p(x) and resamples from norm(max(p - onehot(x), 0)): still lossless.
    """

    feature_layers: tuple[int, ...] = ()

    def __init__(self, n: int = 3, block_size: int = 7, vocab_size: int = 0) -> None:
        self.n, self.gamma, self.vocab = int(n), int(block_size), int(vocab_size)

    def propose(self, slots, anchors, seq_buf, feat_buf, temperature, generator) -> Proposal:  # type: ignore[no-untyped-def]
        from specsim.record.ngram import lookup

        rows = [
            lookup(seq_buf[s, : a + 1].cpu().numpy(), int(a), self.n, self.gamma)
            for s, a in zip(slots.tolist(), anchors.tolist(), strict=True)
        ]
        tokens = np.stack([r[0] for r in rows]).astype(np.int64)
        q = None
        if temperature > 0:
            q = torch.zeros((tokens.shape[0], self.gamma, self.vocab), dtype=torch.float32)
            q.scatter_(2, torch.from_numpy(tokens)[..., None], 1.0)
        return Proposal(tokens=tokens, conf=np.stack([r[1] for r in rows]), q=q)


def make_proposer(spec: str, target: Any, block_size: int | None = None) -> tuple[Any, str]:
    """A proposer by name: ``dspark`` (the trained drafter in the cache), a DSpark checkpoint
    directory, ``ngram[:N]``, or ``init`` (an UNTRAINED DSpark drafter initialised from the
    target's last layers: a cost stand-in, acceptance near zero). Returns (proposer, name)."""
    from pathlib import Path

    from specsim.errors import SpecsimError

    model = target.model
    if spec.startswith("ngram"):
        n = int(spec.split(":", 1)[1]) if ":" in spec else 3
        g = block_size or 7
        return NgramProposer(n, g, int(model.config.vocab_size)), f"ngram:{n}"
    from specsim.record.dspark import (
        DSparkDrafter,
        config_for_target,
        init_from_target,
        load_drafter,
    )

    if spec == "init":
        cfg = config_for_target(model.config, block_size=block_size or 7)
        drafter = DSparkDrafter(cfg)
        init_from_target(drafter, model, None)
        return DSparkProposer(drafter.to(target.device).eval(), model), "dspark:init"
    from specsim.record.build import DRAFTER_NAMES, find_drafter_dir

    if spec in DRAFTER_NAMES:
        path = find_drafter_dir(target, spec)
        if not path.exists():
            raise SpecsimError(
                f"no trained DSpark drafter for this target at {path}; run 'specsim "
                "train-drafter' first, or pass --drafter ngram"
            )
    else:
        path = Path(spec).expanduser()
    drafter = load_drafter(path, device=target.device)
    if block_size and block_size != drafter.cfg.block_size:
        raise SpecsimError(
            f"the drafter at {path} drafts blocks of {drafter.cfg.block_size}, not {block_size}; "
            "drop --block-size"
        )
    return DSparkProposer(drafter, model), f"dspark:{path.name}"
