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


def _bf16(a: np.ndarray) -> np.ndarray:
    """Round to bfloat16 (round to nearest even), returned as float64."""
    bits = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


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


def q_threshold_scheduler(view: BlockView) -> int:
    """Verify drafts while the draft model's OWN probability q(x_k) >= 0.5: reads x_k itself."""
    ok = view.q_drafts >= Q_THRESHOLD
    return int(first_rejection(ok[None, :])[0])


def zos_current_as_lagged(view: BlockView) -> int:
    """ZOS whose "lagged" budget is computed from the CURRENT confidences (the run-ahead wired
    to the wrong buffer): a global search over c_{k+1} again."""
    b = view.batch
    conf = b.conf_matrix(view.conf_row)
    budget = global_budget(conf, b.step_time)
    req, _ = ranked_candidates(conf)
    return int(lengths_from_admitted(req, budget, conf.shape[0])[b.index])


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
        _m("q-threshold-scheduler", "exact+statistical", "anticipating scheduler",
           scheduler=q_threshold_scheduler, doc=q_threshold_scheduler.__doc__),
        _m("specinfer-no-update", "exact+statistical", "multi-draft bug",
           multi=specinfer_no_update, doc=specinfer_no_update.__doc__),
        _m("without-replacement-iid-rule", "exact+statistical", "multi-draft bug",
           multi=specinfer, without_replacement=True,
           doc="Candidates drawn without replacement but verified with the i.i.d. rule"),
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
