"""Vectorised samplers for the statistical checks: one block, many times, all uniforms at once.

Law sampled: the next gamma+1 tokens after the empty prompt. The request drafts a block, the
scheduler picks l, the verifier emits its tokens, and the target itself continues (from p) up to
gamma+1 tokens. Lossless iff that law is the product of p's, which the exact oracle knows: the
G-test compares the counts with it. Draft realisations are few (V^gamma), so the scheduler runs
once per realisation and samples index into the table, never calling Python per sample.
"""

from __future__ import annotations

import itertools

import numpy as np

from specsim.lossless.oracle import BlockView, policy_scheduler, target_law
from specsim.lossless.pipeline import Pipeline
from specsim.lossless.uniforms import check_block_output
from specsim.lossless.verifiers import sample_from
from specsim.policies.base import Policy
from specsim.rng import stream


def _encode(tokens: np.ndarray, vocab: int) -> np.ndarray:
    """Base-V code of each row of (N, j) tokens."""
    return (tokens * vocab ** np.arange(tokens.shape[1] - 1, -1, -1)).sum(axis=1)


def target_cells(toy, length: int, greedy: bool) -> np.ndarray:
    """The target's law over all V^length sequences, indexed by base-V code."""
    probs = np.zeros(toy.vocab**length)
    for s, w in target_law(toy, length, greedy=greedy).items():
        probs[_encode(np.asarray([s]), toy.vocab)[0]] = w
    return probs


def sample_block(world, pipe: Pipeline, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(counts, target probabilities) over the V^(gamma+1) cells, from ``n`` sampled blocks."""
    toy, gamma, batch = world.toy, world.gamma, world.batch
    vocab = toy.vocab
    rng = stream(seed, f"lossless/{pipe.name}/{world.name}")
    if pipe.multi is not None:
        return _sample_multi(world, pipe, n, rng)
    sched = pipe.scheduler
    if not callable(sched) or isinstance(sched, Policy):
        sched = policy_scheduler(sched)
    drafts = np.array(list(itertools.product(range(vocab), repeat=gamma)), dtype=np.int64)
    weight = np.ones(drafts.shape[0])
    ps = np.zeros((drafts.shape[0], gamma + 1, vocab))
    qs = np.zeros((drafts.shape[0], gamma, vocab))
    lengths = np.zeros(drafts.shape[0], dtype=np.int64)
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
            lengths[d] = int(sched(BlockView(conf, batch, drafts[d], q_x)))
    pick = rng.choice(drafts.shape[0], size=n, p=weight / weight.sum())
    out = np.full((n, gamma + 1), -1, dtype=np.int64)
    for length in np.unique(lengths[pick]):
        rows = np.flatnonzero(lengths[pick] == length)
        d = pick[rows]
        if pipe.sample_rule is not None:
            n_acc, tok = pipe.sample_rule(ps[d], qs[d], drafts[d], int(length), rng)
        else:
            u = rng.random((rows.shape[0], gamma))
            v = rng.random(rows.shape[0])
            n_acc, tok = pipe.rule(ps[d], qs[d], drafts[d], int(length), u, v)
        n_acc, tok = check_block_output(n_acc, tok, rows.shape[0], int(length), vocab, "verifier")
        pos = np.arange(gamma + 1)
        out[rows] = np.where(pos < n_acc[:, None], np.pad(drafts[d], ((0, 0), (0, 1))), -1)
        out[rows, n_acc] = tok
    _continue_from_target(out, toy, pipe.greedy, rng)
    counts = np.bincount(_encode(out, vocab), minlength=vocab ** (gamma + 1))
    return counts, target_cells(toy, gamma + 1, pipe.greedy)


def _continue_from_target(out: np.ndarray, toy, greedy: bool, rng) -> None:
    """Fill the -1 tail of each row by sampling the target (in place)."""
    vocab = toy.vocab
    for j in range(1, out.shape[1]):
        rows = np.flatnonzero(out[:, j] < 0)
        if rows.size == 0:
            continue
        table = np.stack([toy.p(s) for s in itertools.product(range(vocab), repeat=j)])
        laws = table[_encode(out[rows, :j], vocab)]
        if greedy:
            out[rows, j] = np.argmax(laws, axis=1)
        else:
            out[rows, j] = sample_from(laws, rng.random(rows.shape[0]))


def _sample_multi(world, pipe: Pipeline, n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """Multi-draft: k = gamma candidates for the first token; law of that token vs p."""
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
    return np.bincount(np.asarray(tok), minlength=vocab), p.copy()
