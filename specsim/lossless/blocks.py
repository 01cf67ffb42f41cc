"""The exact law of ONE block at a given state: what it emits, by the length verified.

A block at state (y, state) drafts gamma tokens from q after y, the scheduler picks l from the
confidence matrix (and, if it reads it, the engine state), the verifier accepts n <= l drafts and
emits one more token: x_1..x_n, t. Its *kernel* is the law of (l, emitted tokens), an array
(gamma+1, E) over the E = V + V^2 + ... + V^(gamma+1) emitted sequences (:class:`Emissions`).

Why a bank (:class:`KernelBank`): a generation visits many states, but what a block's law depends
on is few things: the laws after y (for a toy with a finite ``context``, the last tokens of y),
the token before the block (the confidence head reads it) and the part of the engine state the
pipeline declares it reads (:mod:`specsim.lossless.state`). Kernels are shared between states
that agree on those, and the verifier's integral over its uniforms is shared between blocks with
the same tables: two blocks after every prefix cost about what one block after one prefix did.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from specsim.lossless.oracle import Batch, BlockView, length_law
from specsim.lossless.state import BlockState, bind, key_of, rule_key, scheduler_key
from specsim.lossless.toy import Seq, ToyLM
from specsim.lossless.uniforms import CannotProve, block_laws

MAX_PROBLEMS = 40_000  # (block, length) integrals beyond which the exact check refuses to start


@dataclass(frozen=True)
class Emissions:
    """Index of the sequences one block can emit (1 to gamma+1 tokens), shortest first, each
    length in base-V order: index = offset[j] + code, code = sum e_i V^(j-1-i)."""

    vocab: int
    gamma: int

    @cached_property
    def offset(self) -> np.ndarray:
        """offset[j] for j = 1..gamma+2 (offset[gamma+2] = E); offset[0] unused."""
        sizes = [self.vocab**j for j in range(1, self.gamma + 2)]
        return np.concatenate(([0, 0], np.cumsum(sizes))).astype(np.int64)

    @property
    def size(self) -> int:
        return int(self.offset[self.gamma + 2])

    @cached_property
    def length(self) -> np.ndarray:
        """(E,) tokens emitted by each index."""
        sizes = [self.vocab**j for j in range(1, self.gamma + 2)]
        return np.repeat(np.arange(1, self.gamma + 2), sizes)

    @cached_property
    def code(self) -> np.ndarray:
        return np.arange(self.size) - self.offset[self.length]

    def segment(self, j: int) -> slice:
        return slice(int(self.offset[j]), int(self.offset[j + 1]))

    def seq(self, index: int) -> Seq:
        j, c = int(self.length[index]), int(self.code[index])
        return decode(c, j, self.vocab)


def decode(code: int, length: int, vocab: int) -> Seq:
    out = []
    for _ in range(length):
        code, t = divmod(code, vocab)
        out.append(t)
    return tuple(reversed(out))


@dataclass(frozen=True, eq=False)
class Tables:
    """Every draft realisation of one block after y: drafts (D, gamma) in base-V order, their
    probability under the drafter, the target and draft laws along them, confidences, and a
    content key per draft (what the verifier's integral depends on)."""

    drafts: np.ndarray
    weight: np.ndarray
    ps: np.ndarray  # (D, gamma+1, V)
    qs: np.ndarray  # (D, gamma, V): the laws the verifier is told
    conf: np.ndarray  # (D, gamma)
    q_x: np.ndarray  # (D, gamma): q(x_k) as reported
    content: list[bytes]


def block_tables(toy: ToyLM, y: Seq, gamma: int, drafter: Callable) -> Tables:
    """The tables of a block after y. Laws are looked up once per distinct draft prefix."""
    vocab = toy.vocab
    drafts = np.array(list(itertools.product(range(vocab), repeat=gamma)), dtype=np.int64)
    n_d = drafts.shape[0]
    ps = np.empty((n_d, gamma + 1, vocab))
    qs = np.empty((n_d, gamma, vocab))
    conf = np.empty((n_d, gamma))
    weight = np.ones(n_d)
    last = y[-1] if y else -1
    for k in range(gamma + 1):
        rows = n_d // vocab**k  # drafts sharing one prefix x[:k] are contiguous
        for c in range(vocab**k):
            u = decode(c, k, vocab)
            sl = slice(c * rows, (c + 1) * rows)
            ps[sl, k] = toy.p((*y, *u))
            if k < gamma:
                qk = toy.q((*y, *u))
                qs[sl, k] = qk
                law = np.asarray(drafter(qk))
                weight[sl] *= law[drafts[sl, k]]
                conf[sl, k] = toy.conf(y, k + 1, u[-1] if u else last)
    q_x = np.take_along_axis(qs, drafts[..., None], axis=-1)[..., 0]
    content = [ps[d].tobytes() + qs[d].tobytes() + drafts[d].tobytes() for d in range(n_d)]
    return Tables(drafts, weight, ps, qs, conf, q_x, content)


class KernelBank:
    """Kernels of one pipeline in one world, computed on demand and shared between states.

    ``prepare(states)`` computes the kernels of many states at once (the verifier integrated over
    its uniforms in one vectorised call per verified length); ``kernel(y, state)`` returns one.
    """

    def __init__(
        self,
        toy: ToyLM,
        gamma: int,
        scheduler: Callable,
        rule: Callable,
        batch: Batch,
        drafter: Callable,
        extra: Callable | None = None,
        max_problems: int = MAX_PROBLEMS,
    ):
        self.toy, self.gamma, self.batch = toy, gamma, batch
        self.scheduler, self.rule, self.drafter, self.extra = scheduler, rule, drafter, extra
        self.rule_key, self.sched_key = rule_key(rule), scheduler_key(scheduler)
        self.em = Emissions(toy.vocab, gamma)
        self.max_problems = max_problems
        self.kernels: dict[Hashable, np.ndarray] = {}
        self.laws: dict[tuple, np.ndarray] = {}  # (length, rule key, content) -> (l+1, V)
        self.lengths: dict[tuple, np.ndarray] = {}  # scheduler answers, (gamma+1,) laws
        self.tables: dict[Hashable, Tables] = {}
        self.integrated = 0

    @property
    def stateless(self) -> bool:
        """True when neither the rule nor the scheduler reads the engine state."""
        return self.rule_key is None and self.sched_key is None

    def tables_key(self, y: Seq) -> Hashable:
        """What a block's tables depend on: the context of y and its last token."""
        return (self.toy.context_key(y), y[-1] if y else -1)

    def key(self, y: Seq, state: BlockState) -> Hashable:
        return (self.tables_key(y), key_of(self.rule_key, state), key_of(self.sched_key, state))

    def kernel(self, y: Seq, state: BlockState) -> np.ndarray:
        """(gamma+1, E): probability of verifying l and emitting each sequence."""
        k = self.key(y, state)
        if k not in self.kernels:
            self.prepare([(y, state)])
        return self.kernels[k]

    def block_tables(self, y: Seq) -> Tables:
        tk = self.tables_key(y)
        if tk not in self.tables:
            self.tables[tk] = block_tables(self.toy, y, self.gamma, self.drafter)
        return self.tables[tk]

    def length_laws(self, tab: Tables, state: BlockState) -> np.ndarray:
        """(D, gamma+1): the scheduler's law of l for every draft realisation."""
        skey = key_of(self.sched_key, state)
        out = np.zeros((tab.drafts.shape[0], self.gamma + 1))
        for d in np.flatnonzero(tab.weight > 0):
            ck = (tab.conf[d].tobytes(), tab.drafts[d].tobytes(), tab.q_x[d].tobytes(), skey)
            if ck not in self.lengths:
                view = BlockView(tab.conf[d], self.batch, tab.drafts[d], tab.q_x[d], state)
                self.lengths[ck] = length_law(self.scheduler(view), self.gamma)
            out[d] = self.lengths[ck]
        return out

    def prepare(self, states: Iterable[tuple[Seq, BlockState]]) -> None:
        """Compute the kernels of ``states`` not computed yet, integrating every new block of one
        verified length and one rule state in one call."""
        pending: dict[Hashable, tuple[Tables, np.ndarray]] = {}
        for y, state in states:
            k = self.key(y, state)
            if k in self.kernels or k in pending:
                continue
            tab = self.block_tables(y)
            pending[k] = (tab, self.length_laws(tab, state))
        need: dict[tuple, dict[tuple, tuple[Tables, int]]] = defaultdict(dict)
        for k, (tab, lengths) in pending.items():
            rkey = k[1]
            for length in range(self.gamma + 1):
                for d in np.flatnonzero((lengths[:, length] > 0) & (tab.weight > 0)):
                    pk = (length, rkey, tab.content[d])
                    if pk not in self.laws:
                        need[(length, rkey)][pk] = (tab, int(d))
        total = self.integrated + sum(len(v) for v in need.values())
        if total > self.max_problems:
            raise CannotProve(
                f"{total:,} blocks to integrate exceed the exact check's budget "
                f"({self.max_problems:,}): the model's laws depend on too much of the prefix "
                "(give it a finite context) or the world is too large"
            )
        for (length, rkey), group in need.items():
            items = list(group.items())
            p = np.stack([t.ps[d] for _, (t, d) in items])
            q = np.stack([t.qs[d] for _, (t, d) in items])
            x = np.stack([t.drafts[d] for _, (t, d) in items])
            laws = block_laws(bind(self.rule, rkey), p, q, x, length, extra=self.extra)
            for (pk, _), law in zip(items, laws, strict=True):
                self.laws[pk] = law
            self.integrated += len(items)
        for k, (tab, lengths) in pending.items():
            self.kernels[k] = self._assemble(tab, lengths, k[1])

    def _assemble(self, tab: Tables, lengths: np.ndarray, rkey: Hashable) -> np.ndarray:
        em, vocab, gamma = self.em, self.toy.vocab, self.gamma
        kern = np.zeros((gamma + 1, em.size))
        n_d = tab.drafts.shape[0]
        # code of x[:n] for every draft (base-V order: the leading digits of the draft's index)
        pcode = np.arange(n_d)[:, None] // vocab ** (gamma - np.arange(gamma + 1))[None, :]
        tokens = np.arange(vocab)
        for length in range(gamma + 1):
            ds = np.flatnonzero((lengths[:, length] > 0) & (tab.weight > 0))
            if ds.size == 0:
                continue
            laws = np.stack([self.laws[(length, rkey, tab.content[d])] for d in ds])
            w = tab.weight[ds] * lengths[ds, length]
            for n in range(length + 1):
                idx = em.offset[n + 1] + pcode[ds, n][:, None] * vocab + tokens[None, :]
                np.add.at(kern[length], idx, w[:, None] * laws[:, n, :])
        return kern
