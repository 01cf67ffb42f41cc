"""Tiny language models given as tables: the worlds in which losslessness is checked exactly.

A :class:`ToyLM` has a vocabulary of 2-5 tokens and three lookups, each a function of the tokens
generated so far (the prompt is empty):

- ``p(seq)``: the target's next-token law, (V,);
- ``q(seq)``: the draft model's next-token law, (V,);
- ``conf(prefix, k, prev)``: the confidence c_k of draft position k (1-based) of a block drafted
  after the committed ``prefix``, given the previous token ``prev`` (x_{k-1}; the last committed
  token for k = 1, -1 at the very start). That is DSpark's Markov confidence head: c_k sees the
  previous draft token, so c_{k+1} leaks x_k to any scheduler that reads it.

Random tables (:func:`random_toy`) are generated lazily from (seed, role, context), so a model is
defined on every prefix without building tables, the same seed gives the same model bit for bit,
and zeros, near-one masses and ties appear on purpose: that is where verifiers break.

``context`` is how many trailing tokens the three lookups depend on (0: the same laws everywhere,
like the paper's Appendix A; 1: a bigram model; None: the whole sequence). A finite context is
what lets the checker cover every state a long generation can reach: the block laws after any
prefix are among the few it enumerates (:mod:`specsim.lossless.window`), and the sampled test
can stratify blocks by their context (:mod:`specsim.lossless.sampling`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numpy as np

from specsim.errors import SpecsimError

Seq = tuple[int, ...]
_ROLE = {"p": 1, "q": 2, "conf": 3}


@dataclass(frozen=True, eq=False)
class ToyLM:
    """A target p, a draft q and a Markov confidence head over a vocabulary of ``vocab``.

    ``context``: p(seq) and q(seq) depend on the last ``context`` tokens of seq only, and
    conf(prefix, k, prev) on the last ``context`` tokens of prefix (and k, prev); None: on
    everything. A promise the checker relies on, so only state one that holds.
    """

    vocab: int
    p: Callable[[Seq], np.ndarray]
    q: Callable[[Seq], np.ndarray]
    conf: Callable[[Seq, int, int], float]
    name: str = "toy"
    context: int | None = None

    def context_key(self, seq: Seq) -> Seq:
        """What the laws after ``seq`` depend on (see :func:`context_key`)."""
        return context_key(self.context, seq)


def context_key(context: int | None, seq: Seq) -> Seq:
    """The last ``context`` tokens of seq (all of a shorter one, so the start of a generation
    is a context of its own), or seq itself when ``context`` is None."""
    if context is None:
        return tuple(seq)
    return tuple(seq[max(0, len(seq) - context) :]) if context else ()


def _rng(seed: int, role: str, key: Seq) -> np.random.Generator:
    # +2 keeps every entry non-negative (prev = -1 and the separator -2 occur).
    return np.random.default_rng([int(seed), _ROLE[role], len(key), *(k + 2 for k in key)])


def _random_law(rng: np.random.Generator, vocab: int, zeros: float, near_one: float, ties: float):
    """A probability vector with, on purpose, zeros, near-one masses and exact ties."""
    law = rng.dirichlet(np.full(vocab, 0.7))
    if rng.random() < zeros:
        mask = rng.random(vocab) < 0.4
        mask[rng.integers(vocab)] = False  # keep at least one token
        law[mask] = 0.0
    if rng.random() < near_one:
        law = np.full(vocab, 1e-7)
        law[rng.integers(vocab)] = 1.0
    if rng.random() < ties and vocab >= 2:
        top = np.argsort(-law, kind="stable")[:2]
        law[top[1]] = law[top[0]]
    return law / law.sum()


def random_toy(
    seed: int,
    vocab: int = 3,
    zeros: float = 0.3,
    near_one: float = 0.1,
    ties: float = 0.1,
    conf_extremes: float = 0.15,
    context: int | None = None,
) -> ToyLM:
    """A random table LM, defined lazily on every prefix from ``seed``.

    ``zeros``/``near_one``/``ties``: chance that a row has zero entries, is near one-hot, or has
    its top two entries tied. ``conf_extremes``: chance that a confidence is exactly 0 or 1.
    ``context``: laws depend on the last ``context`` tokens only (None: on the whole prefix).
    """
    if not 2 <= vocab <= 8:
        raise SpecsimError(f"toy vocabulary must have 2..8 tokens (got {vocab})")

    @cache
    def law(role: str, key: Seq) -> np.ndarray:
        return _random_law(_rng(seed, role, key), vocab, zeros, near_one, ties)

    def p(seq: Seq) -> np.ndarray:
        return law("p", context_key(context, seq))

    def q(seq: Seq) -> np.ndarray:
        return law("q", context_key(context, seq))

    @cache
    def conf_at(key: Seq, k: int, prev: int) -> float:
        rng = _rng(seed, "conf", (*key, -2, k, prev))  # -2: separator
        if rng.random() < conf_extremes:
            return float(rng.integers(2))
        return float(rng.random())

    def conf(prefix: Seq, k: int, prev: int) -> float:
        return conf_at(context_key(context, prefix), k, prev)

    name = f"random(seed={seed}, V={vocab}" + ("" if context is None else f", context={context}")
    return ToyLM(vocab=vocab, p=p, q=q, conf=conf, name=name + ")", context=context)


def stationary_toy(
    p: np.ndarray, q: np.ndarray, conf: Callable[[Seq, int, int], float], name: str = "fixed"
) -> ToyLM:
    """A toy whose p and q are the same at every position (the paper's Appendix A is one).

    Its ``conf`` must not read the prefix (context 0): it may read k and the previous token."""
    p_arr = np.asarray(p, dtype=np.float64)
    q_arr = np.asarray(q, dtype=np.float64)
    return ToyLM(
        vocab=p_arr.shape[0], p=lambda s: p_arr, q=lambda s: q_arr, conf=conf, name=name, context=0
    )


def appendix_a_toy() -> ToyLM:
    """DSpark Appendix A: V = {A, B}, p = (0.7, 0.3), q = (0.5, 0.5), c_1 = 0.8,
    c_2 = 0.9 after x_1 = A and 0 after x_1 = B."""

    def conf(prefix: Seq, k: int, prev: int) -> float:
        if k == 1:
            return 0.8
        return 0.9 if prev == 0 else 0.0

    return stationary_toy([0.7, 0.3], [0.5, 0.5], conf, name="appendix-A")


def validate_law(law: np.ndarray, vocab: int, what: str) -> np.ndarray:
    """A probability vector of length ``vocab`` summing to 1, or a one-line error."""
    arr = np.asarray(law, dtype=np.float64)
    if arr.shape != (vocab,):
        raise SpecsimError(f"{what} has shape {arr.shape}, expected ({vocab},)")
    if not np.all(np.isfinite(arr)) or arr.min() < 0:
        raise SpecsimError(f"{what} has negative or non-finite entries; return probabilities")
    if abs(arr.sum() - 1.0) > 1e-9:
        raise SpecsimError(f"{what} sums to {arr.sum():.12g}, not 1; normalise it")
    return arr
