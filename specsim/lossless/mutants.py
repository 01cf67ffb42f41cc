"""A catalogue of broken verifiers, drafters and schedulers: the suite must catch every one.

Each mutant reproduces a bug seen in a real engine or a scheduler that peeks at the future (see
``docs/losslessness.md``), and says how it is expected to be caught: ``exact`` (the enumerated law
differs from the target's by more than 1e-9), ``edge`` (a zero-probability token is emitted at an
extreme uniform, u = 0, which fp32 generators do produce: measure zero, so only a deterministic
check sees it) or ``statistical`` as well (the G-test at alpha = 1e-6 rejects it at the sample
size used).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specsim.lossless.oracle import BlockView
from specsim.lossless.pipeline import Pipeline
from specsim.lossless.state import BlockState, stateless
from specsim.lossless.subtle_mutants import (  # the catalogue lists them
    _bf16,
    band_1e2,
    band_1e3,
    band_3e3_rejected,
    bf16_acceptance_uniforms,
    bonus_temperature_v4,
    fixed_point_uniforms,
    flip_small_v,
    position2_bf16_ratio,
    reject_small_u,
    second_block_stale_ratio,
    vocab_chunk_carry,
)
from specsim.lossless.uniforms import _cdf_points, truncated
from specsim.lossless.verifiers import (
    acceptance_ratio,
    final_law,
    first_rejection,
    normalise,
    rejection,
    rrs_without_replacement,
    sample_from,
    specinfer,
    thresholded,
    typical,
)
from specsim.policies.base import Policy, StepInput
from specsim.policies.hw_aware import global_budget, lengths_from_admitted, ranked_candidates


@dataclass(frozen=True, eq=False)
class Mutant:
    pipeline: Pipeline
    caught_by: tuple[str, ...]  # among "exact", "edge", "statistical"
    source: str  # where the bug comes from

    @property
    def name(self) -> str:
        return self.pipeline.name


# --- broken verifiers (block protocol of specsim.lossless.verifiers) -------------------------


def residual_not_renormalised(p, q, x, u, v):
    """Inverse CDF over max(p - q, 0) without dividing by its mass (nor scaling v): the mass
    the residual lacks piles onto the last token."""
    n = first_rejection(u < acceptance_ratio(p, q, x))
    rows = np.arange(n.shape[0])
    law = final_law(p, q, n, residual_fn=lambda pn, qn: np.maximum(pn - qn, 0.0))
    cdf = np.cumsum(law, axis=-1)
    idx = np.minimum((cdf <= v[:, None]).sum(axis=-1), law.shape[-1] - 1)
    bonus = n == q.shape[1]
    idx[bonus] = sample_from(p[rows[bonus], n[bonus]], v[bonus])
    return n, idx


def recovered_from_p(p, q, x, u, v):
    """After a rejection, the recovered token is drawn from p instead of the residual."""
    n = first_rejection(u < acceptance_ratio(p, q, x))
    return n, sample_from(final_law(p, q, n, residual_fn=lambda pn, qn: pn), v)


def residual_from_p_alone(p, q, x, u, v):
    """The residual is built from p alone: p with the rejected token removed, renormalised."""
    n = first_rejection(u < acceptance_ratio(p, q, x))
    rows = np.arange(n.shape[0])
    k = np.minimum(n, max(x.shape[1] - 1, 0))

    def resid(pn, qn):
        out = pn.copy()
        out[rows, x[rows, k]] = 0.0
        return normalise(out, pn)

    return n, sample_from(final_law(p, q, n, residual_fn=resid), v)


def shared_uniform(p, q, x, u, v):
    """One uniform reused at every position (a single draw broadcast over the block)."""
    same = np.repeat(u[:, :1], u.shape[1], axis=1) if u.shape[1] else u
    n = first_rejection(same < acceptance_ratio(p, q, x))
    return n, sample_from(final_law(p, q, n), v)


def bonus_wrong_position(p, q, x, u, v):
    """After full acceptance the bonus token is drawn from p at the LAST VERIFIED position
    (off by one) instead of the next one."""
    n = first_rejection(u < acceptance_ratio(p, q, x))
    length = x.shape[1]
    law = final_law(p, q, n)
    if length:
        law = np.where((n == length)[:, None], p[:, length - 1], law)
    return n, sample_from(law, v)


def accept_le_ratio(p, q, x, u, v):
    """``u <= ratio`` instead of ``u < ratio``: at u = 0 a draft with p(x) = 0 is accepted."""
    n = first_rejection(u <= acceptance_ratio(p, q, x))
    return n, sample_from(final_law(p, q, n), v)


def always_accept(p, q, x, u, v):
    """Every verified draft is accepted (u fixed at 0 with p/q > 0, a "force accept" mode)."""
    n = np.full(x.shape[0], x.shape[1], dtype=np.int64)
    return n, sample_from(p[:, x.shape[1]], v)


def bf16_probabilities(p, q, x, u, v):
    """p and q rounded to bfloat16 before verification (a numerics bug: TV ~1e-3)."""
    pr, qr = _bf16(p), _bf16(q)
    n = first_rejection(u < acceptance_ratio(pr, qr, x))
    return n, sample_from(final_law(pr, qr, n), v)


def _bf16_breakpoints(p, q, x):
    pr, qr = _bf16(p), _bf16(q)
    u_thr = [min(1.0, pr[k, x[k]] / qr[k, x[k]]) for k in range(x.shape[0]) if qr[k, x[k]] > 0]
    v_thr: list[float] = []
    for k in range(x.shape[0]):
        v_thr += _cdf_points(np.maximum(pr[k] - qr[k], 0.0))
    for k in range(x.shape[0] + 1):
        v_thr += _cdf_points(pr[k])
    return u_thr, v_thr


def greedy_highest_tie(p, q, x, u, v):
    """Greedy matching whose argmax breaks ties towards the HIGHEST token id."""
    vocab = p.shape[-1]
    best = vocab - 1 - np.argmax(p[..., ::-1], axis=-1)
    n = first_rejection(x == best[:, : x.shape[1]])
    return n, best[np.arange(n.shape[0]), n]


# --- broken block rules (they see beyond l) ---------------------------------------------------


def cut_from_residual(p, q, x, length, u, v):
    """Truncation done wrong: the cut position l+1 is sampled from the residual
    norm(max(p - q, 0)) as if its unverified draft had been rejected (it must come from p)."""
    gamma = x.shape[1]
    if length >= gamma:
        return truncated(rejection)(p, q, x, length, u, v)
    forced = u[:, : length + 1].copy()
    forced[:, length] = 1.0  # the draft at the cut is always "rejected"
    xs = x[:, : length + 1]
    n = first_rejection(forced < acceptance_ratio(p[:, : length + 1], q[:, : length + 1], xs))
    n = np.minimum(n, length)
    return n, sample_from(final_law(p[:, : length + 2], q[:, : length + 1], n), v)


# --- broken drafters: drafts drawn from a law other than the q the verifier is told ---------

TOP_K = 2
DRAFT_TEMPERATURE = 0.6


def top_k_drafter(q: np.ndarray) -> np.ndarray:
    """Drafts sampled from the top-2 of q, renormalised; the verifier is told raw q."""
    keep = np.zeros_like(q, dtype=bool)
    keep[np.argsort(-q, kind="stable")[:TOP_K]] = True
    out = np.where(keep, q, 0.0)
    return out / out.sum()


def tempered_drafter(q: np.ndarray) -> np.ndarray:
    """Drafts sampled at temperature 0.6 while q assumes temperature 1."""
    with np.errstate(divide="ignore"):
        logits = np.where(q > 0, np.log(np.where(q > 0, q, 1.0)), -np.inf) / DRAFT_TEMPERATURE
    out = np.exp(logits - logits.max())
    return out / out.sum()


# --- anticipating schedulers ------------------------------------------------------------------

Q_THRESHOLD = 0.5


@stateless
def q_threshold_scheduler(view: BlockView) -> int:
    """Verify drafts while the draft model's OWN probability q(x_k) >= 0.5: reads x_k itself."""
    ok = view.q_drafts >= Q_THRESHOLD
    return int(first_rejection(ok[None, :])[0])


@stateless
def zos_current_as_lagged(view: BlockView) -> int:
    """ZOS whose "lagged" budget is computed from the CURRENT confidences (the run-ahead wired
    to the wrong buffer): a global search over c_{k+1} again."""
    b = view.batch
    conf = b.conf_matrix(view.conf_row)
    budget = global_budget(conf, b.step_time)
    req, _ = ranked_candidates(conf)
    return int(lengths_from_admitted(req, budget, conf.shape[0])[b.index])


@stateless
def calibrated_zos_current_outcomes(view: BlockView) -> int:
    """``calibrated-zos`` whose history already counts THIS step's drafts (the history update
    wired before the decision instead of after the step): each current draft counts as 50
    observations, accepted when the drafter's own q(x_k) >= 0.5, so the calibrated c'_k, and
    with it whether x_k is verified, reads x_k itself."""
    from specsim.lossless.oracle import HIST_BINS, LAGGED_PRIOR, default_history
    from specsim.policies.calibrated import calibrated_zos_lengths

    b = view.batch
    conf = b.conf_matrix(view.conf_row)
    gamma = conf.shape[1]
    hist = (b.accept_hist if b.accept_hist is not None else default_history(gamma)).copy()
    bins = np.minimum((view.conf_row * HIST_BINS).astype(np.int64), HIST_BINS - 1)
    for k in range(gamma):
        hist[0, k, bins[k], 0] += 50
        hist[0, k, bins[k], 1] += 50 * float(view.q_drafts[k] >= Q_THRESHOLD)
    lagged = b.lagged if b.lagged is not None else b.conf_matrix(np.full(gamma, LAGGED_PRIOR))
    inp = StepInput(
        conf=conf, step_time=b.step_time, lagged_conf=lagged, accept_hist=hist,
        request_class=np.zeros(conf.shape[0], np.int64),
    )  # fmt: skip
    return int(calibrated_zos_lengths(inp)[b.index])


def peeks_after_first_block(view: BlockView) -> int:
    """On a request's first block (nothing before it) verify drafts while their own confidence
    c_k >= 0.5; once the request has a non-empty prefix, admit draft k only if the NEXT
    confidence c_{k+1} >= 0.5: it peeks at x_k, but only after the first block."""
    c = view.conf_row
    own = c >= 0.5 if view.state.position == 0 else np.append(c[1:], 1.0) >= 0.5
    return int(first_rejection(own[None, :])[0])


def _after_prefix(state: BlockState) -> bool:
    return state.position > 0


peeks_after_first_block.state_key = _after_prefix  # type: ignore[attr-defined]


PEEK_RATE = 0.1


def random_sometimes_peeks(inp: StepInput) -> np.ndarray:
    """A random policy that, one step in ten (drawn from its own stream inp.rng), admits draft k
    only if the NEXT confidence c_{k+1} is high: random, and anticipating when it peeks."""
    if inp.rng is not None and inp.rng.random() < PEEK_RATE:
        nxt = np.concatenate([inp.conf[:, 1:], np.ones((inp.n_requests, 1))], axis=1)
        return np.cumprod(nxt >= 0.5, axis=1).sum(axis=1)
    return np.full(inp.n_requests, inp.gamma)


def random_length(inp: StepInput) -> np.ndarray:
    """Correct: each request verifies a length drawn uniformly from 0..gamma from the policy's
    own stream, independently of everything (lossless in any engine)."""
    rng = inp.rng if inp.rng is not None else np.random.default_rng(0)
    return rng.integers(0, inp.gamma + 1, size=inp.n_requests)


# --- multi-draft ------------------------------------------------------------------------------


def specinfer_no_update(p, q, xs, u, v):
    """SpecInfer that tests every candidate against the ORIGINAL p (never updates it to the
    residual after a rejection); the fallback uses the first residual only."""
    token = np.full(xs.shape[0], -1, dtype=np.int64)
    rows = np.arange(xs.shape[0])
    for i in range(xs.shape[1]):
        xi = xs[:, i]
        ratio = np.minimum(1.0, p[rows, xi] / np.where(q[rows, xi] > 0, q[rows, xi], 1.0))
        hit = (token < 0) & (u[:, i] < ratio)
        token[hit] = xi[hit]
    rest = token < 0
    token[rest] = sample_from(normalise(np.maximum(p - q, 0.0), p)[rest], v[rest])
    return token


def _m(name, caught, source, **kw) -> Mutant:
    doc = kw.pop("doc", "")
    return Mutant(Pipeline(name=name, doc=doc, **kw), tuple(caught.split("+")), source)


def catalogue() -> list[Mutant]:
    """Every mutant, in the order of the docs' table."""
    t = truncated
    return [
        _m("residual-not-renormalised", "exact+statistical", "engine bug",
           rule=t(residual_not_renormalised), doc=residual_not_renormalised.__doc__),
        _m("recovered-from-p", "exact+statistical", "engine bug",
           rule=t(recovered_from_p), doc=recovered_from_p.__doc__),
        _m("residual-from-p-alone", "exact+statistical", "engine bug",
           rule=t(residual_from_p_alone), doc=residual_from_p_alone.__doc__),
        _m("q-raw-drafts-top-k", "exact+statistical", "engine bug",
           drafter=top_k_drafter, doc=top_k_drafter.__doc__),
        _m("draft-temperature-mismatch", "exact+statistical", "engine bug",
           drafter=tempered_drafter, doc=tempered_drafter.__doc__),
        _m("shared-uniform", "exact+statistical", "engine bug",
           rule=t(shared_uniform), doc=shared_uniform.__doc__),
        _m("bonus-wrong-position", "exact+statistical", "engine bug",
           rule=t(bonus_wrong_position), doc=bonus_wrong_position.__doc__),
        _m("u-le-ratio-zero-prob", "edge", "engine bug (fp32 uniform == 0.0)",
           rule=t(accept_le_ratio), doc=accept_le_ratio.__doc__),
        _m("always-accept", "exact+statistical", "engine bug / force-accept mode",
           rule=t(always_accept), doc=always_accept.__doc__),
        _m("cut-from-residual", "exact+statistical", "truncation bug",
           rule=cut_from_residual, scheduler="static:1", doc=cut_from_residual.__doc__),
        _m("bf16-probabilities", "exact", "numerics",
           rule=t(bf16_probabilities), extra=_bf16_breakpoints, doc=bf16_probabilities.__doc__),
        _m("greedy-highest-tie", "exact+statistical", "tie-break bug",
           rule=t(greedy_highest_tie), greedy=True, doc=greedy_highest_tie.__doc__),
        _m("typical-acceptance", "exact+statistical", "lossy by design (Medusa)",
           rule=t(typical), doc=typical.__doc__),
        _m("thresholded-acceptance", "exact+statistical", "lossy by design",
           rule=t(thresholded), doc=thresholded.__doc__),
        _m("hw-aware-global", "exact+statistical", "anticipating scheduler (Appendix A)",
           scheduler="hw-aware-global", doc="Algorithm 1 without early stop (registry code)"),
        _m("zos-current-as-lagged", "exact+statistical", "anticipating scheduler",
           scheduler=zos_current_as_lagged, doc=zos_current_as_lagged.__doc__),
        _m("calibrated-zos-current-outcomes", "exact", "anticipating scheduler",
           scheduler=calibrated_zos_current_outcomes,
           doc=calibrated_zos_current_outcomes.__doc__),
        _m("q-threshold-scheduler", "exact+statistical", "anticipating scheduler",
           scheduler=q_threshold_scheduler, doc=q_threshold_scheduler.__doc__),
        _m("specinfer-no-update", "exact+statistical", "multi-draft bug",
           multi=specinfer_no_update, doc=specinfer_no_update.__doc__),
        _m("without-replacement-iid-rule", "exact+statistical", "multi-draft bug",
           multi=specinfer, without_replacement=True,
           doc="Candidates drawn without replacement but verified with the i.i.d. rule"),
        *subtle(),
        *later(),
    ]  # fmt: skip


def subtle() -> list[Mutant]:
    """The subtle mutants of issue #12 (TV 1e-4 to 1e-2): bands inside cells, rounded uniforms,
    lossy only at V = 5 or at position >= 2, and a random policy that sometimes peeks."""
    t = truncated
    return [
        _m("band-in-cell-1e-3", "exact", "numerics (issue #12)", rule=t(band_1e3),
           doc=band_1e3.__doc__),
        _m("band-in-cell-1e-2", "exact", "numerics (issue #12)", rule=t(band_1e2),
           doc=band_1e2.__doc__),
        _m("band-3e-3-recovered-only", "exact", "numerics", rule=t(band_3e3_rejected),
           doc=band_3e3_rejected.__doc__),
        _m("flip-when-v-below-1e-3", "exact", "off-by-one (issue #12)", rule=t(flip_small_v),
           doc=flip_small_v.__doc__),
        _m("reject-when-u-below-1e-3", "exact", "invalid-draw guard", rule=t(reject_small_u),
           doc=reject_small_u.__doc__),
        _m("bf16-acceptance-uniforms", "exact", "numerics (issue #12)",
           rule=t(bf16_acceptance_uniforms), doc=bf16_acceptance_uniforms.__doc__),
        _m("fixed-point-uniforms", "exact", "numerics", rule=t(fixed_point_uniforms),
           doc=fixed_point_uniforms.__doc__),
        _m("position2-bf16-ratio", "exact", "mixed precision (position >= 2 only)",
           rule=t(position2_bf16_ratio), doc=position2_bf16_ratio.__doc__),
        _m("vocab-chunk-carry-v5", "exact", "vocabulary chunking (V >= 5 only)",
           rule=t(vocab_chunk_carry), doc=vocab_chunk_carry.__doc__),
        _m("random-policy-sometimes-peeks", "exact+statistical", "random anticipating scheduler",
           scheduler=Policy(name="random-sometimes-peeks", schedule=random_sometimes_peeks),
           doc=random_sometimes_peeks.__doc__),
    ]  # fmt: skip


def later() -> list[Mutant]:
    """Issue #36: bugs a check of the first block's first tokens cannot see: at the bonus
    position only (and only at V >= 4), after the first block only, on the second step only."""
    return [
        _m("bonus-temperature-v4", "exact", "sampling kernel (bonus position, V >= 4 only)",
           rule=truncated(bonus_temperature_v4), doc=bonus_temperature_v4.__doc__),
        _m("peeks-after-first-block", "exact+statistical", "anticipating scheduler, later blocks",
           scheduler=peeks_after_first_block, doc=peeks_after_first_block.__doc__),
        _m("second-block-stale-ratio", "exact+statistical", "stateful verifier (second step)",
           rule=second_block_stale_ratio, doc=second_block_stale_ratio.__doc__),
    ]  # fmt: skip


def correct_pipelines() -> list[Pipeline]:
    """Implementations that must pass every check."""
    from specsim.lossless.verifiers import greedy

    out = [
        Pipeline(name=f"rejection + {s}", scheduler=s)
        for s in (
            "full",
            "ar",
            "static:1",
            "threshold:0.5",
            "cum-threshold:0.4",
            "hw-aware",
            "zos",
            "goodput",
            "calibrated-zos",
        )
    ]
    out += [
        Pipeline(name="greedy + full", rule=truncated(greedy), greedy=True),
        Pipeline(name="specinfer (i.i.d. drafts)", multi=specinfer),
        Pipeline(
            name="rrs without replacement", multi=rrs_without_replacement, without_replacement=True
        ),
    ]
    return out


def by_name(name: str) -> Mutant:
    for m in catalogue():
        if m.name == name:
            return m
    raise KeyError(name)
