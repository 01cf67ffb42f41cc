"""The worlds every pipeline is checked in, and the prefixes the exact check starts from.

A world is a tiny language model (:mod:`specsim.lossless.toy`), a block size, and who shares the
request's steps (:class:`~specsim.lossless.oracle.Batch`). The random worlds are bigram models
(``context=1``): their laws after any prefix are among V + 1 rows, so the exact check can cover
every state a generation reaches, and the statistical check can stratify blocks by the token
before them. They keep, on purpose, zeros, near-one masses, ties and confidences of exactly 0 and
1 (that is where verifiers break).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specsim.lossless.oracle import Batch, alone
from specsim.lossless.toy import Seq, ToyLM, appendix_a_toy, random_toy, stationary_toy
from specsim.rng import stream

PREFIX_LENGTHS = tuple(range(9))  # the exact check starts two blocks after one prefix of each


@dataclass(frozen=True, eq=False)
class World:
    """A finite world to check in: a toy LM, block size (candidates, for multi-draft), batch."""

    name: str
    toy: ToyLM
    gamma: int
    batch: Batch
    seed: int = 0


def jagged_batch(rng: np.random.Generator, n_others: int, gamma: int) -> Batch:
    """Batch-mates with random confidence rows (0s and 1s included) and a jagged SPS table."""
    others = rng.random((n_others, gamma))
    others[rng.random(others.shape) < 0.15] = 0.0
    b_max = (n_others + 1) * (gamma + 1)
    steps = rng.uniform(0.3, 1.0, b_max + 2)  # arbitrary, non-monotone: padding buckets etc.
    sps = np.where(rng.random(b_max + 2) < 0.5, steps, np.minimum.accumulate(steps))
    lagged = rng.random((n_others + 1, gamma))
    return Batch(
        others=others,
        sps=sps,
        index=int(rng.integers(n_others + 1)),
        lagged=lagged,
        accept_rate=rng.random(gamma),
    )


def standard_worlds(seed: int = 0) -> list[World]:
    """The worlds every pipeline is checked in: the paper's Appendix A and random bigram tables
    with zeros, near-one masses and ties, alone and in jagged batches."""
    rng = stream(seed, "lossless/worlds")

    def toy(offset: int, vocab: int, **kw) -> ToyLM:
        return random_toy(seed * 7 + offset, vocab, context=1, **kw)

    appendix = alone(2, sps=[np.nan, 1.0, 0.5, 0.45])
    return [
        World("appendix-A", appendix_a_toy(), 2, appendix, seed),
        World("V3-g2-alone", toy(1, 3), 2, alone(2), seed),
        World("V3-g2-batch3-jagged", toy(2, 3), 2, jagged_batch(rng, 2, 2), seed),
        World("V4-g3-batch2-jagged", toy(3, 4), 3, jagged_batch(rng, 1, 3), seed),
        World("V2-g3-ties-batch4", toy(4, 2, ties=0.5), 3, jagged_batch(rng, 3, 3), seed),
        World("V5-g2-batch2-jagged", toy(7, 5), 2, jagged_batch(rng, 1, 2), seed),
    ]


def multi_worlds(seed: int = 0) -> list[World]:
    """Multi-draft worlds: first-token laws with full draft support, k = 2 or 3 candidates.

    The fixed one (p = (0.5, 0.4, 0.1), q = (0.1, 0.3, 0.6), k = 2) is where both multi-draft
    mutants are far from p (TV 0.15); random tables can hide them (some give TV 0 exactly).
    """
    fixed = stationary_toy([0.5, 0.4, 0.1], [0.1, 0.3, 0.6], lambda s, k, x: 0.5, "fixed")
    return [
        World("multi-fixed-V3-k2", fixed, 2, alone(2), seed),
        World("multi-V3-k2", random_toy(seed * 7 + 5, 3, zeros=0.0, near_one=0.0), 2, alone(2),
              seed),
        World("multi-V4-k3", random_toy(seed * 7 + 6, 4, zeros=0.0, near_one=0.0), 3, alone(3),
              seed),
    ]  # fmt: skip


def stat_worlds(seed: int = 0) -> list[World]:
    """The worlds the statistical checks sample in: all standard worlds."""
    return standard_worlds(seed)


def world_prefixes(world: World) -> tuple[Seq, ...]:
    """One prefix of each length in :data:`PREFIX_LENGTHS`, drawn from the target (seeded by
    the world), the last token of the k-th one forced to token k mod V where the target allows
    it: the prefixes end in every token, so every context starts a checked window."""
    toy, vocab = world.toy, world.toy.vocab
    rng = stream(world.seed, f"lossless/prefixes/{world.name}")
    out: list[Seq] = []
    for length in PREFIX_LENGTHS:
        seq: Seq = ()
        for i in range(length):
            p = np.asarray(toy.p(seq), dtype=np.float64)
            want = (length - 1) % vocab
            last = i == length - 1
            t = want if last and p[want] > 0 else int(rng.choice(vocab, p=p / p.sum()))
            seq = (*seq, t)
        out.append(seq)
    return tuple(out)
