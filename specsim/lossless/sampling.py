"""Vectorised samplers for the statistical checks: blocks of runs from the empty prompt.

Law sampled: every block a generation starts at positions 0..:func:`horizon` (the first block,
then the blocks after it, each in the state the run left it in: its context, how many steps were
taken, how the previous one went), so the first two blocks after any prefix of up to
:data:`PREFIX_MAX` tokens. Of each block, the window of gamma+1 tokens from where it
starts: what it emits, continued by the target. Counts are kept per *stratum*, the block's
context (the start of a generation, or the last tokens before it for a toy with a finite
context), since the target law of the window depends on nothing else. Lossless iff, in every
stratum, the window has the target's law there (:func:`specsim.lossless.window.continuation`).
A toy whose laws depend on the whole prefix gets the first block only (one stratum).

Why this law: a verifier or a scheduler that is lossy only later in a generation (after a
non-empty prefix, on the second step, after a fully accepted block) is sampled where it is lossy,
with the state it would really have. Under a lossless pipeline each block's window, given
everything before it, has the target's law in its context, so the stratified G-test is valid for
blocks of one run as for independent ones.

Why it is fast: a run's state takes few values, so the tables of each (drafts, their
probabilities, the scheduler's length law) are computed once (:class:`KernelBank`); a step
draws the (length, draft) cell of every run by inverse CDF, calls the verifier ONCE per
verified length with arrays of uniforms, and continues the windows from precomputed target
laws. Counts accumulate chunk by chunk, so 1e8 samples need the memory of one chunk.
"""

from __future__ import annotations

import itertools

import numpy as np

from specsim.lossless.blocks import KernelBank
from specsim.lossless.oracle import policy_scheduler
from specsim.lossless.pipeline import Pipeline
from specsim.lossless.state import BlockState, bind, key_of
from specsim.lossless.uniforms import check_block_output
from specsim.lossless.verifiers import sample_from
from specsim.lossless.window import continuation
from specsim.policies.base import Policy
from specsim.rng import stream

CHUNK = 1 << 17  # blocks per chunk (about)
PREFIX_MAX = 8  # the first two blocks after any prefix of up to 8 tokens are sampled


def horizon(toy, gamma: int) -> int:
    """Last start position of a sampled block: PREFIX_MAX + gamma + 1 (the second block after a
    prefix of PREFIX_MAX tokens starts there at the latest) for a toy with a finite context; 0
    (the first block only) for one whose laws depend on the whole prefix."""
    return PREFIX_MAX + gamma + 1 if toy.context is not None else 0


def _encode(tokens: np.ndarray, vocab: int) -> np.ndarray:
    """Base-V code of each row of (N, j) tokens."""
    return (tokens * vocab ** np.arange(tokens.shape[1] - 1, -1, -1)).sum(axis=1)


def _inverse_cdf(cdf: np.ndarray, last: np.ndarray, u: np.ndarray) -> np.ndarray:
    """What :func:`~specsim.lossless.verifiers.sample_from` computes, from precomputed rows."""
    idx = (cdf <= (u * cdf[:, -1])[:, None]).sum(axis=-1)
    return np.minimum(idx, last)


class _Lookup:
    """Small non-negative int codes -> values computed once each (``make(code)``): a dense
    array when the code space is small (no sort on the hot path), a dict otherwise."""

    def __init__(self, space: int, make, dtype=np.int64, width: int = 0):
        self.make = make
        self.dense = space <= 1 << 16
        shape = (space, width) if width else (space,)
        self.values = np.zeros(shape, dtype=dtype) if self.dense else {}
        self.have = np.zeros(space, dtype=bool) if self.dense else None

    def __call__(self, codes: np.ndarray) -> np.ndarray:
        if not self.dense:
            uniq, inv = np.unique(codes, return_inverse=True)
            for c in uniq.tolist():
                if c not in self.values:
                    self.values[c] = self.make(c)
            return np.asarray([self.values[c] for c in uniq.tolist()])[inv.reshape(-1)]
        new = ~self.have[codes]
        if new.any():
            for c in np.unique(codes[new]).tolist():
                self.values[c] = self.make(c)
                self.have[c] = True
        return self.values[codes]


class _Contexts:
    """Last-token contexts of a finite-context toy as small integers (-1 padding at the start
    of a generation): codes in base V+1, their tuples, and the target's law after them."""

    def __init__(self, toy, greedy: bool):
        self.toy, self.greedy = toy, greedy
        self.width = toy.context or 0
        vocab = toy.vocab
        self.cdf = _Lookup((vocab + 1) ** self.width, lambda c: np.cumsum(self._law(self.key(c))),
                           np.float64, vocab)  # fmt: skip
        self.last = _Lookup((vocab + 1) ** self.width, lambda c: _last(self._law(self.key(c))))
        self.full: dict = {}

    def _law(self, seq: tuple[int, ...]) -> np.ndarray:
        law = np.asarray(self.toy.p(seq), dtype=np.float64)
        return np.eye(law.shape[0])[np.argmax(law)] if self.greedy else law

    def codes(self, tokens: np.ndarray) -> np.ndarray:
        """(N,) codes of the contexts of (N, L) token rows (-1: no token), last ``width``."""
        return encode_tail(tokens, self.width, self.toy.vocab)

    def key(self, code: int) -> tuple[int, ...]:
        digits = []
        for _ in range(self.width):
            code, d = divmod(int(code), self.toy.vocab + 1)
            digits.append(d - 1)
        return tuple(t for t in reversed(digits) if t >= 0)

    def sample_after(self, tokens: np.ndarray, u: np.ndarray) -> np.ndarray:
        """One token from the target after each row of (N, L) tokens (-1: none, in front)."""
        if self.toy.context is None:  # the whole sequence matters (first block only)
            uniq, inv = np.unique(tokens, axis=0, return_inverse=True)
            for r in map(tuple, uniq.tolist()):
                if r not in self.full:
                    law = self._law(tuple(t for t in r if t >= 0))
                    self.full[r] = (np.cumsum(law), _last(law))
            rows = [self.full[r] for r in map(tuple, uniq.tolist())]
            cdf = np.stack([r[0] for r in rows])[inv.reshape(-1)]
            last = np.array([r[1] for r in rows])[inv.reshape(-1)]
            return _inverse_cdf(cdf, last, u)
        codes = self.codes(tokens)
        return _inverse_cdf(self.cdf(codes), self.last(codes), u)


def _last(law: np.ndarray) -> int:
    """The last token with mass (what rounding at u -> 1 is clipped to)."""
    return int(np.flatnonzero(law > 0)[-1])


def encode_tail(tokens: np.ndarray, width: int, vocab: int) -> np.ndarray:
    """Codes in base V+1 of the last ``width`` columns of (N, L) tokens (-1 -> digit 0)."""
    if width == 0:
        return np.zeros(tokens.shape[0], dtype=np.int64)
    tail = tokens[:, tokens.shape[1] - width :] + 1
    return (tail * (vocab + 1) ** np.arange(width - 1, -1, -1)).sum(axis=1)


class BlockSampler:
    """Counts of sampled block windows of one world under one pipeline, chunk after chunk.

    ``counts(n)`` (strata, V^(gamma+1)) continues the same stream: calling it with growing n
    gives the cumulative counts a sequential test looks at. ``probs``: the target law of the
    window in each stratum (rows of :attr:`strata`). Same seed, same counts, bit for bit.
    """

    def __init__(self, world, pipe: Pipeline, seed: int):
        self.world, self.pipe = world, pipe
        self.rng = stream(seed, f"lossless/{pipe.name}/{world.name}")
        toy = world.toy
        self.vocab, self.gamma = toy.vocab, world.gamma
        self.n = 0
        self._buffer = np.zeros(0, dtype=np.int64)
        if pipe.multi is not None:
            self.horizon, self.strata = 0, [()]
            self.probs = np.asarray(toy.p(()), dtype=np.float64).copy()[None]
        else:
            self.horizon = horizon(toy, self.gamma)
            self.ctx = _Contexts(toy, pipe.greedy)
            sched = pipe.scheduler
            if not callable(sched) or isinstance(sched, Policy):
                sched = policy_scheduler(sched)
            rule = pipe.rule
            self.bank = KernelBank(toy, self.gamma, sched, rule, world.batch, pipe.drafter)
            width = self.ctx.width
            self.strata = [s for j in range(width + 1)
                           for s in itertools.product(range(self.vocab), repeat=j)]  # fmt: skip
            if self.horizon == 0:
                self.strata = [()]
            padded = [[-1] * (width - len(s)) + list(s) for s in self.strata]
            codes = self.ctx.codes(np.array(padded, dtype=np.int64).reshape(len(padded), width))
            of = dict(zip(codes.tolist(), range(len(self.strata)), strict=True))
            self.stratum = _Lookup((self.vocab + 1) ** width, of.__getitem__)
            self.keep = max(width, 1)
            space = (self.vocab + 1) ** self.keep
            if not self.bank.stateless:
                space *= (self.horizon + 1) ** 2 * (self.gamma + 2) ** 2
            self.table_at = _Lookup(space, self._table_of_code)
            self.probs = np.stack(
                [continuation(toy, s, self.gamma + 1, pipe.greedy)[0] for s in self.strata]
            )
            self.tables: list[tuple] = []  # per kernel key: (Tables, cdf of cells, rule key id)
            self.table_of: dict = {}
            self.rule_keys: list = []  # the rule's state keys met so far
        self.total = np.zeros(self.probs.shape, dtype=np.int64)

    @property
    def law(self) -> str:
        """What is sampled, in words (for the verdict)."""
        if self.pipe.multi is not None:
            return "the first token"
        if self.horizon == 0:
            return "the first block (the model's laws depend on the whole prefix)"
        return (f"every block starting at positions 0-{self.horizon} of a generation (the first "
                f"two after any prefix of up to {PREFIX_MAX} tokens)")  # fmt: skip

    def counts(self, n: int) -> np.ndarray:
        """Cumulative counts (strata, cells) after ``n`` sampled blocks."""
        cells = self.probs.shape[1]
        while self.n < n:
            if self._buffer.size == 0:
                self._buffer = self._chunk()
            take = self._buffer[: n - self.n]
            self._buffer = self._buffer[take.size :]
            self.total += np.bincount(take, minlength=self.total.size).reshape(-1, cells)
            self.n += take.size
        return self.total.copy()

    def _chunk(self) -> np.ndarray:
        if self.pipe.multi is not None:
            return _multi_chunk(self.world, self.pipe, CHUNK, self.rng)
        runs = CHUNK if self.horizon == 0 else CHUNK // 4
        keep = max(self.ctx.width, 1)
        tail = np.full((runs, keep), -1, dtype=np.int64)
        pos = np.zeros(runs, dtype=np.int64)
        step = np.zeros(runs, dtype=np.int64)
        prev = np.full((runs, 2), -1, dtype=np.int64)
        active = np.arange(runs)
        out = []
        while active.size:
            codes, emitted = self._step(tail[active], pos[active], step[active], prev[active])
            out.append(codes)
            n_out, length, tokens = emitted
            full = np.concatenate([tail[active], tokens], axis=1)
            tail[active] = np.take_along_axis(full, n_out[:, None] + np.arange(keep), axis=1)
            pos[active] += n_out
            step[active] += 1
            prev[active] = np.stack([length, n_out - 1], axis=1)
            active = active[pos[active] <= self.horizon]
        return np.concatenate(out)

    def _state_codes(self, tail, pos, step, prev) -> np.ndarray:
        """One int per run: its last tokens and, for a pipeline that reads it, its state."""
        code = encode_tail(tail, self.keep, self.vocab)
        if self.bank.stateless:
            return code
        h, g = self.horizon + 1, self.gamma + 2
        return (((code * h + pos) * h + step) * g + prev[:, 0] + 1) * g + prev[:, 1] + 1

    def _table_of_code(self, code: int) -> int:
        state = BlockState()
        if not self.bank.stateless:
            h, g = self.horizon + 1, self.gamma + 2
            code, pn = divmod(code, g)
            code, pl = divmod(code, g)
            code, st = divmod(code, h)
            code, pos = divmod(code, h)
            prev = None if pl == 0 else (pl - 1, pn - 1)
            state = BlockState(pos, st, prev)
        digits = []
        for _ in range(self.keep):
            code, d = divmod(code, self.vocab + 1)
            digits.append(d - 1)
        y = tuple(t for t in reversed(digits) if t >= 0)
        return self._table(y, state)

    def _table(self, y: tuple, state: BlockState) -> int:
        bank = self.bank
        k = bank.key(y, state)
        if k not in self.table_of:
            tab = bank.block_tables(y)
            lengths = bank.length_laws(tab, state)
            joint = (lengths * tab.weight[:, None]).T.ravel()  # cell = length * D + draft
            rkey = key_of(bank.rule_key, state)
            if rkey not in self.rule_keys:
                self.rule_keys.append(rkey)
            self.table_of[k] = len(self.tables)
            self.tables.append((tab, np.cumsum(joint), self.rule_keys.index(rkey)))
        return self.table_of[k]

    def _step(self, tail, pos, step, prev):
        """One block of every run: (window codes, (tokens emitted, length, tokens))."""
        gamma, vocab, rng = self.gamma, self.vocab, self.rng
        m = tail.shape[0]
        table = self.table_at(self._state_codes(tail, pos, step, prev))
        length = np.zeros(m, dtype=np.int64)
        draft = np.zeros(m, dtype=np.int64)
        p = np.empty((m, gamma + 1, vocab))
        q = np.empty((m, gamma, vocab))
        x = np.empty((m, gamma), dtype=np.int64)
        rkey = np.zeros(m, dtype=np.int64)
        for t in np.flatnonzero(np.bincount(table)).tolist():
            sel = np.flatnonzero(table == t)
            tab, cdf, key = self.tables[t]
            cell = np.searchsorted(cdf, rng.random(sel.size) * cdf[-1], side="right")
            cell = np.minimum(cell, cdf.size - 1)
            n_d = tab.drafts.shape[0]
            length[sel], draft[sel] = cell // n_d, cell % n_d
            p[sel], q[sel], x[sel] = tab.ps[draft[sel]], tab.qs[draft[sel]], tab.drafts[draft[sel]]
            rkey[sel] = key
        n_acc = np.zeros(m, dtype=np.int64)
        tok = np.zeros(m, dtype=np.int64)
        group = length * len(self.rule_keys) + rkey
        for g in np.flatnonzero(np.bincount(group)).tolist():
            sel = np.flatnonzero(group == g)
            ln, key = divmod(g, len(self.rule_keys))
            if self.pipe.sample_rule is not None:
                out = self.pipe.sample_rule(p[sel], q[sel], x[sel], ln, rng)
            else:
                rule = bind(self.pipe.rule, self.rule_keys[key])
                out = rule(p[sel], q[sel], x[sel], ln, rng.random((sel.size, gamma)),
                           rng.random(sel.size))  # fmt: skip
            n_sel, t_sel = check_block_output(out[0], out[1], sel.size, ln, vocab, "verifier")
            n_acc[sel], tok[sel] = n_sel, t_sel
        positions = np.arange(gamma + 1)
        window = np.where(positions < n_acc[:, None], np.pad(x, ((0, 0), (0, 1))), -1)
        window[np.arange(m), n_acc] = tok
        emitted = window.copy()
        self._continue(tail, window)
        stratum = self.stratum(self.ctx.codes(tail))
        codes = stratum * vocab ** (gamma + 1) + _encode(window, vocab)
        return codes, (n_acc + 1, length, emitted)

    def _continue(self, tail: np.ndarray, window: np.ndarray) -> None:
        """Fill the -1 tail of each window by sampling the target after what precedes it."""
        for j in range(1, window.shape[1]):
            rows = np.flatnonzero(window[:, j] < 0)
            if rows.size == 0:
                continue
            before = np.concatenate([tail[rows], window[rows, :j]], axis=1)
            window[rows, j] = self.ctx.sample_after(before, self.rng.random(rows.size))


def _multi_chunk(world, pipe: Pipeline, n: int, rng) -> np.ndarray:
    """Multi-draft: k = gamma candidates for the first token; the token of each case."""
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
    tok = np.asarray(tok, dtype=np.int64)
    if tok.shape != (n,) or (n and (tok.min() < 0 or tok.max() >= vocab)):
        from specsim.errors import SpecsimError

        raise SpecsimError(
            f"multi-draft verifier returned {tok.shape} tokens or ids outside [0, {vocab}); "
            "return one token id per case"
        )
    return tok
