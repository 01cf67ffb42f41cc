"""Vectorised samplers for the statistical checks: one block, many times, in chunks.

Law sampled: the next gamma+1 tokens after the empty prompt. The request drafts a block, the
scheduler picks l, the verifier emits its tokens, and the target itself continues (from p) up to
gamma+1 tokens. Lossless iff that law is the product of p's, which the exact oracle knows.

Why it is fast: draft realisations are few (V^gamma), so the scheduler runs once per realisation
(64 times for a random policy: the law of its length over seeded draws of its own stream) and the
sampler only draws (draft, length) cells by a multinomial per chunk. Each chunk hands the verifier
arrays of uniforms for all its cases with the same length in ONE call; counts accumulate over
chunks, so 1e8 samples need no more memory than one chunk (:data:`CHUNK`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from specsim.lossless.oracle import BlockView, length_law, policy_scheduler, target_law
from specsim.lossless.pipeline import Pipeline
from specsim.lossless.uniforms import check_block_output
from specsim.lossless.verifiers import sample_from
from specsim.policies.base import Policy
from specsim.rng import stream

CHUNK = 1 << 17


def _encode(tokens: np.ndarray, vocab: int) -> np.ndarray:
    """Base-V code of each row of (N, j) tokens."""
    return (tokens * vocab ** np.arange(tokens.shape[1] - 1, -1, -1)).sum(axis=1)


def target_cells(toy, length: int, greedy: bool) -> np.ndarray:
    """The target's law over all V^length sequences, indexed by base-V code."""
    probs = np.zeros(toy.vocab**length)
    for s, w in target_law(toy, length, greedy=greedy).items():
        probs[_encode(np.asarray([s]), toy.vocab)[0]] = w
    return probs


class BlockSampler:
    """Counts of the next gamma+1 tokens of one world under one pipeline, chunk after chunk.

    ``counts(n)`` continues the same stream: calling it with growing n gives the cumulative
    counts a sequential test looks at. Same seed, same counts, bit for bit.
    """

    def __init__(self, world, pipe: Pipeline, seed: int):
        self.world, self.pipe = world, pipe
        self.rng = stream(seed, f"lossless/{pipe.name}/{world.name}")
        toy = world.toy
        self.vocab, self.gamma = toy.vocab, world.gamma
        self.total = np.zeros(self.vocab ** (self.gamma + 1), dtype=np.int64)
        self.n = 0
        if pipe.multi is None:
            self._tables()
            laws = [
                np.stack([toy.p(s) for s in itertools.product(range(self.vocab), repeat=j)])
                for j in range(self.gamma + 1)
            ]  # target laws after every prefix of length j, by base-V code
            # Precomputed inverse-CDF tables: exactly what sample_from computes per row.
            self.cont_cdf = [np.cumsum(law, axis=-1) for law in laws]
            self.cont_last = [law.shape[-1] - 1 - np.argmax((law > 0)[:, ::-1], axis=-1)
                              for law in laws]  # fmt: skip
            self.cont_argmax = [np.argmax(law, axis=-1) for law in laws]
        self.probs = (
            toy.p(()).copy() if pipe.multi is not None
            else target_cells(toy, self.gamma + 1, pipe.greedy)
        )  # fmt: skip
        if pipe.multi is not None:
            self.total = np.zeros(self.vocab, dtype=np.int64)

    def _tables(self) -> None:
        toy, gamma, vocab, pipe = self.world.toy, self.gamma, self.vocab, self.pipe
        sched = pipe.scheduler
        if not callable(sched) or isinstance(sched, Policy):
            sched = policy_scheduler(sched)
        drafts = np.array(list(itertools.product(range(vocab), repeat=gamma)), dtype=np.int64)
        n_d = drafts.shape[0]
        weight = np.ones(n_d)
        ps = np.zeros((n_d, gamma + 1, vocab))
        qs = np.zeros((n_d, gamma, vocab))
        lengths = np.zeros((n_d, gamma + 1))
        for d, x in enumerate(map(tuple, drafts)):
            for k in range(gamma):
                qs[d, k] = toy.q(x[:k])
                weight[d] *= pipe.drafter(qs[d, k])[x[k]]
            for k in range(gamma + 1):
                ps[d, k] = toy.p(x[:k])
            if weight[d] > 0:
                prev = [-1, *x[: gamma - 1]]
                conf = np.array([toy.conf((), k + 1, prev[k]) for k in range(gamma)])
                q_x = qs[d, np.arange(gamma), drafts[d]]
                lengths[d] = length_law(sched(BlockView(conf, self.world.batch, drafts[d], q_x)),
                                        gamma)  # fmt: skip
        # Cells (length, draft), ordered by length so a chunk's cases of one length are contiguous.
        joint = (lengths * weight[:, None]).T.ravel()
        self.cell_p = joint / joint.sum()
        self.cell_len = np.repeat(np.arange(gamma + 1), n_d)
        self.cell_d = np.tile(np.arange(n_d), gamma + 1)
        self.drafts, self.ps, self.qs = drafts, ps, qs

    def counts(self, n: int) -> np.ndarray:
        """Cumulative counts over the V^(gamma+1) cells (multi-draft: V) after ``n`` samples."""
        for size in _chunks(n - self.n):
            self.total += self._chunk(size)
            self.n += size
        return self.total.copy()

    def _chunk(self, size: int) -> np.ndarray:
        if self.pipe.multi is not None:
            return _multi_chunk(self.world, self.pipe, size, self.rng)
        gamma, vocab, pipe, rng = self.gamma, self.vocab, self.pipe, self.rng
        per_cell = rng.multinomial(size, self.cell_p)
        cells = np.repeat(np.arange(per_cell.shape[0]), per_cell)
        out = np.full((size, gamma + 1), -1, dtype=np.int64)
        pos = np.arange(gamma + 1)
        start = 0
        for length in range(gamma + 1):
            m = int(per_cell[self.cell_len == length].sum())
            if m == 0:
                continue
            d = self.cell_d[cells[start : start + m]]
            p, q, x = self.ps[d], self.qs[d], self.drafts[d]
            if pipe.sample_rule is not None:
                n_acc, tok = pipe.sample_rule(p, q, x, length, rng)
            else:
                n_acc, tok = pipe.rule(p, q, x, length, rng.random((m, gamma)), rng.random(m))
            n_acc, tok = check_block_output(n_acc, tok, m, length, vocab, "verifier")
            rows = slice(start, start + m)
            out[rows] = np.where(pos < n_acc[:, None], np.pad(x, ((0, 0), (0, 1))), -1)
            out[start + np.arange(m), n_acc] = tok
            start += m
        self._continue(out)
        return np.bincount(_encode(out, vocab), minlength=vocab ** (gamma + 1))

    def _continue(self, out: np.ndarray) -> None:
        """Fill the -1 tail of each row by sampling the target (in place)."""
        vocab = self.vocab
        for j in range(1, out.shape[1]):
            rows = np.flatnonzero(out[:, j] < 0)
            if rows.size == 0:
                continue
            code = _encode(out[rows, :j], vocab)
            if self.pipe.greedy:
                out[rows, j] = self.cont_argmax[j][code]
                continue
            cdf = self.cont_cdf[j][code]
            scaled = self.rng.random(rows.shape[0]) * cdf[:, -1]
            idx = (cdf <= scaled[:, None]).sum(axis=-1)
            out[rows, j] = np.minimum(idx, self.cont_last[j][code])


def _chunks(n: int) -> Iterator[int]:
    while n > 0:
        yield min(n, CHUNK)
        n -= CHUNK


def sample_block(world, pipe: Pipeline, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(counts, target probabilities) over the V^(gamma+1) cells, from ``n`` sampled blocks."""
    s = BlockSampler(world, pipe, seed)
    return s.counts(n), s.probs


def _multi_chunk(world, pipe: Pipeline, n: int, rng) -> np.ndarray:
    """Multi-draft: k = gamma candidates for the first token; counts of that token."""
    toy, k = world.toy, world.gamma
    p, q = toy.p(()), toy.q(())
    vocab = toy.vocab
    if pipe.without_replacement:
        keys = rng.random((n, vocab))
        with np.errstate(divide="ignore"):
            keys = np.where(q > 0, np.log(keys) / np.where(q > 0, q, 1.0), -np.inf)
        xs = np.argsort(-keys, axis=1, kind="stable")[:, :k]  # Gumbel-top-k: without replacement
    else:
        xs = sample_from(np.broadcast_to(q, (n * k, vocab)), rng.random(n * k)).reshape(n, k)
    tok = pipe.multi(
        np.broadcast_to(p, (n, vocab)).copy(), np.broadcast_to(q, (n, vocab)).copy(), xs,
        rng.random((n, k)), rng.random(n),
    )  # fmt: skip
    return np.bincount(np.asarray(tok), minlength=vocab)
