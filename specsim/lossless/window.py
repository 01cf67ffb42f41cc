"""The exact law of whole blocks: what the exact check proves, and over which states.

Lossless means every block, at every state a generation can reach, emits tokens whose law,
continued by the target itself, is the target's. The exact check proves two things from block
kernels (:mod:`specsim.lossless.blocks`):

- :func:`window_law` with ``blocks=2``: the law of the next W = 2(gamma+1) tokens after a prefix,
  the first two blocks emitted by the pipeline and the rest (if any) continued by the target. The
  window holds two whole blocks, bonus tokens included, so state carried from one step to the
  next is inside it.
- :func:`reachable`: every state a block can start in, from the empty prompt up to a horizon
  (for a toy with a finite context; every state at any position when the pipeline reads no
  engine state). :func:`window_law` with ``blocks=1`` at each is the law the sampled check
  (:mod:`specsim.lossless.sampling`) tests, so a proof covers what the sampler draws.

Laws are dense arrays over the V^W windows (base-V codes, first token most significant).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specsim.lossless.blocks import KernelBank, decode
from specsim.lossless.oracle import TOLERANCE
from specsim.lossless.state import BlockState
from specsim.lossless.toy import Seq, ToyLM
from specsim.lossless.uniforms import CannotProve

BLOCKS = 2  # whole blocks in the exact window after each prefix
MAX_CELLS = 1 << 20  # windows of V^W beyond this are refused (memory)


@dataclass(frozen=True)
class WindowLaw:
    """The pipeline's law and the target's over the ``width`` tokens after ``prefix``."""

    prefix: Seq
    law: np.ndarray
    target: np.ndarray
    vocab: int
    width: int

    @property
    def tv(self) -> float:
        return 0.5 * float(np.abs(self.law - self.target).sum())

    @property
    def lossless(self) -> bool:
        return self.tv <= TOLERANCE

    def worst(self) -> tuple[Seq, float, float]:
        """The window with the largest |law - target|: the counterexample to show."""
        i = int(np.argmax(np.abs(self.law - self.target)))
        return decode(i, self.width, self.vocab), float(self.law[i]), float(self.target[i])

    def marginal(self, position: int = 0) -> np.ndarray:
        """Law of the token at ``position`` of the window (0-based)."""
        shape = (self.vocab,) * self.width
        axes = tuple(a for a in range(self.width) if a != position)
        return self.law.reshape(shape).sum(axis=axes)


def _next_laws(toy: ToyLM, y: Seq, i: int, greedy: bool) -> np.ndarray:
    """(V^i, V): the target's law after y + u for every u of i tokens (argmax if greedy)."""
    vocab, ctx = toy.vocab, toy.context
    if ctx is not None and i >= ctx:  # the context of y + u lies in u: its last ctx tokens
        rows = np.stack([toy.p((*y, *decode(c, ctx, vocab))) for c in range(vocab**ctx)])
        laws = rows[np.arange(vocab**i) % vocab**ctx]
    else:
        laws = np.stack([toy.p((*y, *decode(c, i, vocab))) for c in range(vocab**i)])
    if greedy:
        laws = np.eye(vocab)[np.argmax(laws, axis=-1)]
    return laws


def continuation(toy: ToyLM, y: Seq, width: int, greedy: bool) -> list[np.ndarray]:
    """S[j] (V^width,), j = 0..width: the probability that the target, after y + w[:j],
    continues with w[j:]. S[0] is the target's law of the window."""
    vocab = toy.vocab
    if vocab**width > MAX_CELLS:
        raise CannotProve(f"a window of {vocab}^{width} sequences is too large to enumerate")
    codes = np.arange(vocab**width)
    out = [np.ones(vocab**width)]
    for i in range(width - 1, -1, -1):
        step = _next_laws(toy, y, i, greedy).ravel()[codes // vocab ** (width - 1 - i)]
        out.append(step * out[-1])
    return out[::-1]


def emitted(bank: KernelBank, y: Seq, state: BlockState, blocks: int) -> dict[int, np.ndarray]:
    """Law of the tokens the next ``blocks`` blocks emit, by their number J: {J: (V^J,)}."""
    em, vocab = bank.em, bank.toy.vocab
    kern = bank.kernel(y, state)
    if blocks == 1:
        total = kern.sum(axis=0)
        return {j: total[em.segment(j)] for j in range(1, bank.gamma + 2)}
    rows = [(bank.gamma, kern.sum(axis=0))] if bank.stateless else list(enumerate(kern))
    steps = []  # (weight, first block's tokens, state after it)
    for length, row in rows:
        for idx in np.flatnonzero(row > 0):
            e = em.seq(int(idx))
            n = len(e) - 1
            steps.append((float(row[idx]), int(em.code[idx]), e, state.after(max(length, n), n)))
    bank.prepare([((*y, *e), st) for _, _, e, st in steps])
    out: dict[int, np.ndarray] = {}
    for w, code, e, st in steps:
        for j2, law in emitted(bank, (*y, *e), st, blocks - 1).items():
            total = len(e) + j2
            arr = out.setdefault(total, np.zeros(vocab**total))
            arr[code * vocab**j2 : (code + 1) * vocab**j2] += w * law
    return out


def window_law(
    bank: KernelBank,
    prefix: Seq,
    greedy: bool = False,
    blocks: int = BLOCKS,
    state: BlockState | None = None,
) -> WindowLaw:
    """The exact law of the ``blocks * (gamma+1)`` tokens after ``prefix``: ``blocks`` blocks
    of the pipeline (from ``state``; default: the prefix is the prompt), then the target."""
    width = blocks * (bank.gamma + 1)
    state = BlockState(position=len(prefix)) if state is None else state
    cont = continuation(bank.toy, prefix, width, greedy)
    law = np.zeros(bank.toy.vocab**width)
    for j, arr in emitted(bank, prefix, state, blocks).items():
        law += np.repeat(arr, bank.toy.vocab ** (width - j)) * cont[j]
    return WindowLaw(prefix, law, cont[0], bank.toy.vocab, width)


def _tail(seq: Seq, keep: int) -> Seq:
    return seq[max(0, len(seq) - keep) :]


def reachable(bank: KernelBank, horizon: int) -> list[tuple[Seq, BlockState]]:
    """Every state a block can start in, from the empty prompt, as (last tokens, state).

    A pipeline that reads no engine state needs one state per block context (then the list
    covers every position, not only the horizon); one that does is followed through every state
    of blocks starting at positions 0..``horizon``. Needs a toy with a finite context.
    """
    toy = bank.toy
    if toy.context is None:
        raise CannotProve("the model's laws depend on the whole prefix: no finite set of states")
    keep, vocab, em = max(toy.context, 1), toy.vocab, bank.em
    start: tuple[Seq, BlockState] = ((), BlockState())
    seen = {_node(bank, *start)}
    frontier, out = [start], []
    while frontier:
        bank.prepare(frontier)
        out += frontier
        nxt = []
        for y, st in frontier:
            kern = bank.kernel(y, st)
            rows = [(bank.gamma, kern.sum(axis=0))] if bank.stateless else list(enumerate(kern))
            for length, row in rows:
                for j in range(1, bank.gamma + 2):
                    codes = np.flatnonzero(row[em.segment(j)] > 0)
                    if codes.size == 0:
                        continue
                    st2 = st.after(max(length, j - 1), j - 1)
                    if not bank.stateless and st2.position > horizon:
                        continue
                    if j >= keep:  # the next context is the emitted block's last tokens
                        tails = {
                            decode(int(c), keep, vocab) for c in np.unique(codes % vocab**keep)
                        }
                    else:
                        tails = {_tail((*y, *decode(int(c), j, vocab)), keep) for c in codes}
                    for y2 in tails:
                        node = _node(bank, y2, st2)
                        if node not in seen:
                            seen.add(node)
                            nxt.append((y2, st2))
        frontier = nxt
    return out


def _node(bank: KernelBank, y: Seq, state: BlockState):
    return bank.tables_key(y) if bank.stateless else (bank.tables_key(y), state)
