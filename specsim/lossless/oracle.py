"""The exact law of a request's output under a scheduler and a verifier, by enumeration.

The world (all of it finite): a :class:`~specsim.lossless.toy.ToyLM`; the request under study
drafts blocks of gamma tokens from q autoregressively; its confidence row c_1..c_gamma comes from
the Markov head (c_k is a function of the committed prefix and x_{k-1}); its batch-mates have
fixed confidence rows and the cost of a step is an SPS table (:class:`Batch`); the scheduler sees
the whole confidence matrix, exactly as the engine hands it over, and picks l for the request; the
verifier's law given (drafts, l) is integrated exactly over its uniforms
(:func:`~specsim.lossless.uniforms.block_law`). Blocks repeat until m tokens are out. Summing
over every draft realisation gives the law of the first m tokens, to compare with the target's
(product of p's) to 1e-9.

Schedulers here are functions of a :class:`BlockView`; :func:`policy_scheduler` adapts a
registry policy (the very code the simulator runs). Anticipating mutants may read the drafts
themselves (a threshold on q(x_k)); a registry policy cannot.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from specsim.errors import SpecsimError
from specsim.lossless.state import BlockState, rule_key
from specsim.lossless.toy import Seq, ToyLM
from specsim.lossless.uniforms import BlockRule, block_laws, truncated
from specsim.lossless.verifiers import rejection
from specsim.policies.base import Policy, StepInput, check_lengths, get_policy

TOLERANCE = 1e-9  # lossless: total variation to the target law at most this
LAGGED_PRIOR = 0.8  # the study request's lagged confidences when a Batch gives none
HIST_BINS = 20  # confidence bins of a verification history (as the engine keeps it)


def default_history(gamma: int) -> np.ndarray:
    """A fixed, uneven verification history (1 class, gamma positions, HIST_BINS bins, [reached,
    accepted]) for policies that read ``accept_hist`` when a Batch gives none: past outcomes
    are fixed numbers to the current block, as they are in an engine."""
    rng = np.random.default_rng([20261130, gamma])
    reached = rng.integers(0, 40, (1, gamma, HIST_BINS)).astype(np.float64)
    accepted = np.floor(reached * rng.random(reached.shape))
    return np.stack([reached, accepted], axis=-1)


@dataclass(frozen=True, eq=False)
class Batch:
    """Who shares the study request's steps, and what a step costs.

    ``others``: (R-1, gamma) fixed confidence rows of the batch-mates. ``sps``: target steps per
    second at a token batch of B = index (index 0 unused); jagged curves are just arrays.
    ``index``: the study request's row. ``lagged``: (R, gamma) confidences from two steps earlier
    (fixed numbers: they never see the current drafts; default: the batch-mates' rows and
    :data:`LAGGED_PRIOR` for the study row). ``accept_rate``: (gamma,) online acceptance
    estimate (for ``goodput``). ``accept_hist``: verification history of earlier steps (for
    ``calibrated-zos``; default :func:`default_history`). ``drafted``: the plan asked the
    drafter for fewer tokens than the block (``StepInput.drafted``); verification stays within
    them (the engine clips to them too).
    """

    others: np.ndarray
    sps: np.ndarray
    index: int = 0
    lagged: np.ndarray | None = None
    accept_rate: np.ndarray | None = None
    accept_hist: np.ndarray | None = None  # default: default_history(gamma)
    drafted: int | None = None  # the plan drafted this many tokens (None: the block)

    def step_time(self, b: np.ndarray) -> np.ndarray:
        """Seconds per target step at token batch b (vectorised; b past the table is clipped)."""
        idx = np.clip(np.asarray(b).astype(np.int64), 1, self.sps.shape[0] - 1)
        return 1.0 / self.sps[idx]

    def conf_matrix(self, row: np.ndarray) -> np.ndarray:
        return np.insert(self.others, self.index, row, axis=0)


def alone(gamma: int, sps: np.ndarray | None = None) -> Batch:
    """A batch of one request on a flat cost curve (unless ``sps`` is given)."""
    if sps is None:
        sps = np.ones(gamma + 2)
    return Batch(others=np.zeros((0, gamma)), sps=np.asarray(sps, dtype=np.float64))


@dataclass(frozen=True, eq=False)
class BlockView:
    """What a scheduler may see for one block of the study request."""

    conf_row: np.ndarray  # (gamma,) c_1..c_gamma of the current drafts
    batch: Batch
    drafts: np.ndarray  # (gamma,) the draft tokens: only anticipating mutants read them
    q_drafts: np.ndarray  # (gamma,) q(x_k) as reported: only anticipating mutants read them
    state: BlockState = BlockState()  # the engine's state of the request (specsim.lossless.state)


Scheduler = Callable[[BlockView], "int | np.ndarray"]
Drafter = Callable[[np.ndarray], np.ndarray]


POLICY_DRAWS = 64  # seeded draws of a random policy's stream, shared by every draft outcome


def _policy_stream(j: int) -> np.random.Generator:
    """Draw j of a policy's own stream: the same for every draft outcome of a block (common
    random numbers), so a random choice independent of the drafts stays independent of them."""
    return np.random.default_rng([20261202, j])


def policy_scheduler(spec: str | Policy, draws: int = POLICY_DRAWS) -> Scheduler:
    """Adapt a registry policy: it sees the batch's confidence matrix, the step cost, the lagged
    confidences, the acceptance estimate and its own random stream ``inp.rng``.

    A deterministic policy gives an int. A policy that draws from ``inp.rng`` gives the law of its
    length over ``draws`` seeded draws of that stream (the same draws for every draft outcome),
    an array (gamma+1,). A policy whose output changes between two calls on the same input with
    the same stream is refused (one line): its randomness cannot be integrated.
    """
    policy = get_policy(spec)
    if "accept_len" in policy.needs:
        raise SpecsimError(
            f"policy {policy.name!r} reads the true acceptance length: it is an upper bound, "
            "not a scheduler, and cannot be checked for losslessness"
        )

    def length_for(view: BlockView, rng: np.random.Generator) -> int:
        b = view.batch
        conf = b.conf_matrix(view.conf_row)
        lagged = b.lagged
        if lagged is None:
            lagged = b.conf_matrix(np.full(conf.shape[1], LAGGED_PRIOR))
        hist = b.accept_hist if b.accept_hist is not None else default_history(conf.shape[1])
        inp = StepInput(
            conf=conf, step_time=b.step_time, lagged_conf=lagged, accept_rate=b.accept_rate,
            rng=rng, accept_hist=hist, request_class=np.zeros(conf.shape[0], np.int64),
            drafted=b.drafted,
        )  # fmt: skip
        lengths = check_lengths(policy(inp), inp, policy.name)
        if b.drafted is not None:  # the engine verifies no draft that was not drafted
            lengths = np.minimum(lengths, b.drafted)
        return int(lengths[b.index])

    def schedule(view: BlockView) -> int | np.ndarray:
        first = _policy_stream(0)
        state = first.bit_generator.state
        a = length_for(view, first)
        used = first.bit_generator.state != state
        if length_for(view, _policy_stream(0)) != a:
            raise SpecsimError(
                f"policy {policy.name!r} is not deterministic given its input and its stream: "
                "two calls on the same input gave different lengths; draw any randomness from "
                "inp.rng (StepInput.rng), which the checker integrates over"
            )
        if not used:
            return a
        gamma = view.conf_row.shape[0]
        lengths = [a] + [length_for(view, _policy_stream(j)) for j in range(1, draws)]
        return np.bincount(lengths, minlength=gamma + 1) / draws

    schedule.policy = policy  # type: ignore[attr-defined]
    schedule.state_key = None  # type: ignore[attr-defined]  # a StepInput carries no state
    return schedule


def length_law(choice: int | np.ndarray, gamma: int) -> np.ndarray:
    """A scheduler's answer as a law over lengths 0..gamma (an int is a point mass)."""
    if isinstance(choice, np.ndarray):
        return choice
    law = np.zeros(gamma + 1)
    law[int(choice)] = 1.0
    return law


def same_law(q: np.ndarray) -> np.ndarray:
    """The correct drafter: drafts are drawn from exactly the q the verifier is told."""
    return q


@dataclass(frozen=True)
class OracleResult:
    law: dict[Seq, float]  # first m tokens -> probability
    target: dict[Seq, float]

    @property
    def tv(self) -> float:
        return total_variation(self.law, self.target)

    @property
    def lossless(self) -> bool:
        return self.tv <= TOLERANCE

    def marginal(self, position: int = 0) -> np.ndarray:
        """Law of the token at ``position`` (0-based)."""
        vocab = 1 + max(max(s) for s in self.target)
        out = np.zeros(vocab)
        for s, w in self.law.items():
            out[s[position]] += w
        return out

    def worst(self) -> tuple[Seq, float, float]:
        """The sequence with the largest |law - target|: the counterexample to show."""
        keys = set(self.law) | set(self.target)
        s = max(keys, key=lambda k: abs(self.law.get(k, 0.0) - self.target.get(k, 0.0)))
        return s, self.law.get(s, 0.0), self.target.get(s, 0.0)


def total_variation(a: dict, b: dict) -> float:
    keys = set(a) | set(b)
    return 0.5 * float(sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in keys))


def target_law(toy: ToyLM, m: int, greedy: bool = False) -> dict[Seq, float]:
    """The non-speculative law of the first m tokens: product of p's (argmax chain if greedy)."""
    law: dict[Seq, float] = {(): 1.0}
    for _ in range(m):
        nxt: dict[Seq, float] = {}
        for s, w in law.items():
            p = toy.p(s)
            if greedy:
                nxt[(*s, int(np.argmax(p)))] = w
                continue
            for t in np.flatnonzero(p > 0):
                nxt[(*s, int(t))] = w * float(p[t])
        law = nxt
    return law


def rejection_law(p: np.ndarray, q: np.ndarray, x: np.ndarray, length: int) -> np.ndarray:
    """Closed form of :func:`~specsim.lossless.verifiers.rejection`'s (n, token) law, to
    cross-check the integrator (and for speed where the verifier itself is not under test)."""
    vocab = p.shape[1]
    law = np.zeros((length + 1, vocab))
    alive = 1.0
    for k in range(length):
        qx = q[k, x[k]]
        a = min(1.0, p[k, x[k]] / qx) if qx > 0 else float(p[k, x[k]] > 0)
        resid = np.maximum(p[k] - q[k], 0.0)
        if a < 1.0 and resid.sum() > 0:
            law[k] = alive * (1.0 - a) * resid / resid.sum()
        alive *= a
    law[length] = alive * p[length]
    return law


def output_law(
    toy: ToyLM,
    m: int,
    gamma: int,
    scheduler: Scheduler | str | Policy = "full",
    rule: BlockRule | None = None,
    batch: Batch | None = None,
    drafter: Drafter = same_law,
    greedy: bool = False,
    law_fn: Callable | None = None,
    extra=None,
) -> OracleResult:
    """Exact law of the first m output tokens of the study request.

    ``rule``: the block rule (default: the reference rejection sampler, truncated at l).
    ``drafter(q) -> law``: the law drafts are really drawn from (mutants differ from q).
    ``law_fn(p, q, x, l)``: replaces the exact integration of ``rule`` (closed forms).
    ``greedy``: compare with the argmax chain instead of the product of p's.

    Schedulers see the position (tokens before the block) but no step count or previous block:
    the law of a pipeline that carries state from step to step is
    :func:`specsim.lossless.window.window_law`'s business (what the checker uses).
    """
    if not 1 <= gamma <= 4 or not 1 <= m <= 6:
        raise SpecsimError(f"oracle sizes out of range: gamma {gamma} (1..4), m {m} (1..6)")
    if not callable(scheduler) or isinstance(scheduler, Policy):
        scheduler = policy_scheduler(scheduler)  # type: ignore[arg-type]
    rule = rule or truncated(rejection)
    if rule_key(rule) is not None:
        raise SpecsimError("output_law does not track engine state; use window_law")
    batch = batch or alone(gamma)
    if batch.others.shape[1] != gamma:
        raise SpecsimError(f"batch rows have {batch.others.shape[1]} positions, gamma is {gamma}")

    def laws_of_blocks(p, q, x, length):
        if law_fn is not None:
            return np.stack([law_fn(p[i], q[i], x[i], length) for i in range(x.shape[0])])
        return block_laws(rule, p, q, x, length, extra=extra)

    memo: dict[Seq, dict[Seq, float]] = {}

    def from_state(y: Seq) -> dict[Seq, float]:
        if len(y) >= m:
            return {y[:m]: 1.0}
        if y in memo:
            return memo[y]
        out: dict[Seq, float] = defaultdict(float)
        blocks = []  # (x, weight, p, q, length law)
        for x in itertools.product(range(toy.vocab), repeat=gamma):
            weight, qs, qx = 1.0, [], []
            for k in range(gamma):
                qk = toy.q((*y, *x[:k]))
                weight *= float(drafter(qk)[x[k]])
                qs.append(qk)
                qx.append(qk[x[k]])
                if weight == 0.0:
                    break
            if weight == 0.0:
                continue
            ps = np.stack([toy.p((*y, *x[:k])) for k in range(gamma + 1)])
            prev = [y[-1] if y else -1, *x[: gamma - 1]]
            conf = np.array([toy.conf(y, k + 1, prev[k]) for k in range(gamma)])
            xa = np.asarray(x, dtype=np.int64)
            view = BlockView(conf_row=conf, batch=batch, drafts=xa, q_drafts=np.asarray(qx),
                             state=BlockState(position=len(y)))  # fmt: skip
            blocks.append((x, weight, ps, np.stack(qs), length_law(scheduler(view), gamma)))
        for length in range(gamma + 1):
            group = [blk for blk in blocks if blk[4][length] > 0]
            if not group:
                continue
            laws = laws_of_blocks(
                np.stack([g[2] for g in group]), np.stack([g[3] for g in group]),
                np.array([g[0] for g in group], dtype=np.int64), length,
            )  # fmt: skip
            for (x, weight, _, _, l_law), law in zip(group, laws, strict=True):
                for n, tok in zip(*np.nonzero(law > 0), strict=True):
                    sub = from_state((*y, *x[:n], int(tok)))
                    w = weight * l_law[length] * float(law[n, tok])
                    for s, ws in sub.items():
                        out[s] += w * ws
        memo[y] = dict(out)
        return memo[y]

    return OracleResult(law=from_state(()), target=target_law(toy, m, greedy=greedy))


def multi_output_law(
    verify: Callable, p: np.ndarray, q: np.ndarray, k: int, without_replacement: bool
) -> np.ndarray:
    """Exact law (V,) of a multi-draft verifier's token, over k candidates drawn from q i.i.d.
    or without replacement, and over its uniforms."""
    from specsim.lossless.uniforms import multi_law

    vocab = p.shape[0]
    out = np.zeros(vocab)
    for xs in itertools.product(range(vocab), repeat=k):
        if without_replacement and len(set(xs)) < k:
            continue
        w, cur = 1.0, q.copy()
        for x in xs:
            w *= cur[x]
            if w == 0.0:
                break
            if without_replacement:
                cur = cur.copy()
                cur[x] = 0.0
                cur = cur / cur.sum() if cur.sum() > 0 else cur
        if w == 0.0:
            continue
        out += w * multi_law(verify, p, q, np.asarray(xs, dtype=np.int64))
    return out
