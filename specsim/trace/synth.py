"""Synthetic traces whose confidences are calibrated predictions of acceptance.

Generative model, per (row, draft position k):
- a latent conditional acceptance probability ``pi_k ~ Beta(kappa * m_k, kappa * (1 - m_k))``
  around the profile value ``m_k`` (so E[pi_k] = m_k);
- the outcome ``accepted_k ~ Bernoulli(pi_k)``, independent across k given pi; ``accept_len`` is
  the number of leading successes;
- the confidence ``c_k = pi_k``: a perfectly calibrated prediction, whose sharpness is set by the
  concentration kappa (small kappa = pi near 0 or 1 = informative confidences = high AUROC).
  ``calibration=f`` distorts it as ``sigmoid(f * logit(pi_k))``: f > 1 over-confident, f < 1
  under-confident.

Why this model: the conditional acceptance rate at position k is exactly m_k (so a profile taken
from published curves is reproduced), the confidences are calibrated by construction, and one
number (kappa) sets the AUROC, which :func:`auroc_for` computes exactly so a target AUROC can be
asked for. Probabilities are rounded to ``levels`` steps (default 1/4096, far below any
scheduling decision) so the shipped files compress; the outcome is drawn from the rounded value,
so calibration stays exact. Draft token ids are random integers below ``vocab``, Zipf-distributed
like natural token frequencies (which also keeps the files small): they carry no meaning, and
nothing in specsim reads them from a synthetic trace.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy.stats import beta as beta_dist

from specsim.errors import SpecsimError
from specsim.rng import stream
from specsim.trace.model import TRACE_VERSION, Trace
from specsim.version import __version__

# Conditional acceptance per draft position k = 1..7 (block size 7), from the DSpark paper
# (DeepSeek, 2026; DSpark_paper.pdf in github.com/deepseek-ai/DeepSpec) and the engines it cites:
# - chat: the survival prior a_1..a_7 = 0.78, 0.55, 0.37, 0.24, 0.16, 0.11, 0.08 measured by a
#   public engine, turned into conditionals c_k = a_k / a_{k-1}; tau = 1 + sum a = 3.29 (chat
#   benchmarks: Arena-Hard 3.21, Alpaca 3.58, MT-Bench 3.72).
# - code: c_k = 0.90 * r^(k-1) with r solved so tau = 5.34, the mean of HumanEval 5.52 and MBPP
#   5.16 (DSpark, Qwen3-8B); 0.90 sits above DFlash's 0.87 position-1 rate on code.
# - math: c_k = 0.93 * r^(k-1) (DSpark's ~0.93 position-1 rate on math), tau = 5.98, the mean of
#   GSM8K 6.17 and MATH 5.78.
PROFILES: dict[str, tuple[float, ...]] = {
    "chat": (0.78, 0.705, 0.673, 0.649, 0.667, 0.688, 0.727),
    "code": (0.9, 0.889, 0.878, 0.867, 0.856, 0.845, 0.835),
    "math": (0.93, 0.922, 0.913, 0.905, 0.897, 0.889, 0.881),
}
DEFAULT_AUROC = 0.85  # DSpark's raw confidence AUROC is 0.81-0.91
QWEN3_VOCAB = 151936
ZIPF_EXPONENT = 1.2  # token ids ~ Zipf, like natural token frequencies (~9 bits each)


@dataclass(frozen=True)
class LogNormal:
    """Lengths ``round(median * exp(sigma * z))`` clipped to [lo, hi] (tokens)."""

    median: float
    sigma: float = 0.5
    lo: int = 1
    hi: int = 32768

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        x = np.round(self.median * np.exp(self.sigma * rng.standard_normal(n)))
        return np.clip(x, self.lo, self.hi).astype(np.int32)


Lengths = LogNormal | Sequence[int] | np.ndarray


def _sample_lengths(dist: Lengths, rng: np.random.Generator, n: int, what: str) -> np.ndarray:
    if isinstance(dist, LogNormal):
        return dist.sample(rng, n)
    values = np.asarray(dist, dtype=np.int64)
    if values.ndim != 1 or values.size == 0:
        raise SpecsimError(f"empirical {what} must be a non-empty list of lengths")
    return rng.choice(values, size=n).astype(np.int32)


def _describe(dist: Lengths) -> dict:
    if isinstance(dist, LogNormal):
        return {"lognormal": asdict(dist)}
    values = np.asarray(dist, dtype=np.int64)
    return {"empirical": {"n": int(values.size), "mean": float(values.mean())}}


def profile_tau(profile: Sequence[float]) -> float:
    """Acceptance length under full verification: 1 + sum_k prod_{i<=k} m_i."""
    return float(1.0 + np.cumprod(np.asarray(profile, dtype=np.float64)).sum())


def profile_from_al(al: float, gamma: int) -> tuple[float, ...]:
    """The per-position conditional acceptance of a chain of ``gamma`` drafts whose published
    acceptance length (tokens a verify step emits, the bonus included: AL = 1 + accepted
    drafts) is ``al``: one rate m at every position, solving 1 + m + m^2 + ... + m^gamma = AL
    (what a paper reporting only AL lets one say). For a tree, give its AL (the accepted path's
    length plus the bonus) and its depth: the path is a chain through the tree."""
    if not (math.isfinite(al) and 1.0 <= al <= gamma + 1.0):
        raise SpecsimError(
            f"--al {al}: an acceptance length of {gamma} drafts lies in [1, {gamma + 1}] (1 + "
            "the accepted drafts, the bonus included); give the published AL and its depth"
        )
    lo, hi = 0.0, 1.0
    for _ in range(100):  # profile_tau rises with m: bisection to float precision
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if profile_tau([mid] * gamma) < al else (lo, mid)
    return tuple([(lo + hi) / 2.0] * gamma)


def fit_profile(profile: Sequence[float], gamma: int) -> tuple[float, ...]:
    """The profile cut to ``gamma`` positions, or extended by repeating its last value."""
    p = list(profile)[:gamma]
    return tuple(p + [p[-1]] * (gamma - len(p)))


def _check_profile(profile: Sequence[float]) -> np.ndarray:
    m = np.asarray(profile, dtype=np.float64)
    if m.ndim != 1 or m.size == 0:
        raise SpecsimError("accept profile must be a non-empty list of probabilities")
    if not np.all((m > 0) & (m < 1)):
        raise SpecsimError(
            f"accept profile {list(m)} must hold conditional acceptance rates strictly inside "
            "(0, 1); e.g. 0.8,0.7,0.6"
        )
    return m


def auroc_for(profile: Sequence[float], concentration: float, levels: int = 4096) -> float:
    """The expected pooled conditional AUROC of a synthetic trace, computed exactly.

    Samples at position k are at risk with probability w_k = prod_{j<k} m_j; a positive's score
    has density proportional to p * Beta(a, b)(p) = m * Beta(a+1, b)(p), a negative's
    (1 - m) * Beta(a, b+1)(p). Scores are rounded to ``levels`` steps; ties count one half, as in
    :func:`specsim.trace.stats.auroc`.
    """
    m = _check_profile(profile)
    w = np.concatenate([[1.0], np.cumprod(m)[:-1]])
    edges = np.concatenate([[0.0], (np.arange(levels) + 0.5) / levels, [1.0]])
    pos = np.zeros(levels + 1)
    neg = np.zeros(levels + 1)
    for mk, wk in zip(m, w, strict=True):
        a, b = concentration * mk, concentration * (1 - mk)
        pos += wk * mk * np.diff(beta_dist.cdf(edges, a + 1, b))
        neg += wk * (1 - mk) * np.diff(beta_dist.cdf(edges, a, b + 1))
    pos /= pos.sum()
    neg /= neg.sum()
    below = np.concatenate([[0.0], np.cumsum(neg)[:-1]])
    return float((pos * (below + 0.5 * neg)).sum())


def concentration_for(profile: Sequence[float], target: float, levels: int = 4096) -> float:
    """The Beta concentration kappa whose expected AUROC is ``target`` (bisection in log kappa)."""
    return _concentration_for(tuple(float(x) for x in profile), float(target), int(levels))


@functools.lru_cache(maxsize=64)
def _concentration_for(profile: tuple[float, ...], target: float, levels: int) -> float:
    lo, hi = np.log(1e-2), np.log(1e5)
    best, worst = auroc_for(profile, np.exp(lo), levels), auroc_for(profile, np.exp(hi), levels)
    if not (worst <= target <= best):
        raise SpecsimError(
            f"AUROC {target} is out of reach for this profile: choose one in "
            f"[{worst:.3f}, {best:.3f}]"
        )
    for _ in range(45):
        mid = 0.5 * (lo + hi)
        if auroc_for(profile, np.exp(mid), levels) > target:
            lo = mid
        else:
            hi = mid
    return float(np.exp(0.5 * (lo + hi)))


def _distort(p: np.ndarray, factor: float, levels: int) -> np.ndarray:
    """sigmoid(factor * logit(p)), keeping exact 0 and 1 (they carry no logit)."""
    eps = 0.5 / levels
    q = np.clip(p, eps, 1 - eps)
    out = 1.0 / (1.0 + np.exp(-factor * np.log(q / (1 - q))))
    out = np.round(out * levels) / levels
    return np.where((p == 0) | (p == 1), p, out)


def synth_trace(
    *,
    n_requests: int,
    accept_profile: Sequence[float],
    gamma: int | None = None,
    prompt_len: Lengths = LogNormal(512, 0.8, 16, 8192),  # noqa: B008 - frozen, immutable
    output_len: Lengths = LogNormal(220, 0.35, 55, 660),  # noqa: B008
    auroc: float | None = DEFAULT_AUROC,
    concentration: float | None = None,
    calibration: str | float = "calibrated",
    seed: int = 0,
    category: str | None = None,
    temperature: float = 1.0,
    vocab: int = QWEN3_VOCAB,
    levels: int = 4096,
    mixture: Sequence[tuple[float, Sequence[float]]] | None = None,
    decay_to: float | None = None,
) -> Trace:
    """A synthetic trace (see the module docstring for the model).

    Give ``accept_profile`` (conditional acceptance m_k for k = 1..gamma; ``gamma`` defaults to
    its length and must match it) and either ``auroc`` (a target, turned into a concentration by
    :func:`concentration_for`) or ``concentration`` directly. ``calibration`` is "calibrated" or
    an over/under-confidence factor on the logit. Same arguments, same trace, bit for bit.

    Stress shapes (schedulers' hard cases): ``mixture`` = [(weight, profile), ...] draws each
    REQUEST's profile from the mixture (bimodal acceptance: some requests easy, some hard;
    ``accept_profile`` then only sets the concentration); ``decay_to`` = d multiplies the
    acceptance rates linearly along each request's output, from 1 at its first position to d
    at its last (acceptance decaying as a generation goes on). Confidences stay the latent
    probabilities (calibrated unless ``calibration`` distorts them).
    """
    m = _check_profile(accept_profile)
    if gamma is None:
        gamma = m.size
    if gamma != m.size:
        raise SpecsimError(
            f"accept profile has {m.size} positions but block size is {gamma}; give one rate "
            "per draft position"
        )
    if n_requests < 1:
        raise SpecsimError(f"n_requests = {n_requests} must be at least 1")
    if levels < 2:
        raise SpecsimError(f"levels = {levels} must be at least 2")
    if calibration == "calibrated":
        factor = 1.0
    else:
        try:
            factor = float(calibration)
        except ValueError:
            factor = float("nan")
        if not (np.isfinite(factor) and factor > 0):
            raise SpecsimError(
                f"calibration {calibration!r} must be 'calibrated' or a positive factor on the "
                "logit (> 1 over-confident, < 1 under-confident)"
            )
    if concentration is None:
        if auroc is None:
            raise SpecsimError("give a target auroc or a concentration")
        concentration = concentration_for(m, auroc, levels)
    elif not concentration > 0:
        raise SpecsimError(f"concentration = {concentration} must be > 0")

    lengths_rng = stream(seed, "synth.lengths")
    out_len = np.maximum(_sample_lengths(output_len, lengths_rng, n_requests, "output_len"), 1)
    in_len = np.maximum(_sample_lengths(prompt_len, lengths_rng, n_requests, "prompt_len"), 0)
    offsets = np.zeros(n_requests + 1, dtype=np.int64)
    np.cumsum(out_len, out=offsets[1:])
    rows = int(offsets[-1])

    mrow = np.broadcast_to(m, (rows, gamma))
    if mixture is not None:
        weights = np.array([float(w) for w, _ in mixture], dtype=np.float64)
        comps = np.stack([_check_profile(fit_profile(p, gamma)) for _, p in mixture])
        if weights.size == 0 or np.any(weights < 0) or weights.sum() <= 0:
            raise SpecsimError("mixture weights must be non-negative with a positive sum")
        pick = stream(seed, "synth.mixture").choice(
            comps.shape[0], size=n_requests, p=weights / weights.sum()
        )
        mrow = np.repeat(comps[pick], out_len, axis=0)
    if decay_to is not None:
        if not 0 < decay_to <= 1:
            raise SpecsimError(f"decay_to = {decay_to} must be in (0, 1]")
        frac = np.concatenate([np.arange(n) / max(n - 1, 1) for n in out_len.tolist()])
        mrow = mrow * (1.0 - (1.0 - decay_to) * frac)[:, None]
    mrow = np.clip(mrow, 1e-6, 1 - 1e-6)
    a, b = concentration * mrow, concentration * (1 - mrow)
    pi = stream(seed, "synth.confidence").beta(a, b)
    pi = np.round(pi * levels) / levels
    accepted = stream(seed, "synth.accept").random((rows, gamma)) < pi
    accept_len = np.cumprod(accepted, axis=1).sum(axis=1).astype(np.int16)
    conf = pi if factor == 1.0 else _distort(pi, factor, levels)
    zipf = stream(seed, "synth.drafts").zipf(ZIPF_EXPONENT, size=(rows, gamma))
    drafts = ((zipf - 1) % vocab).astype(np.int32)

    params = {
        "generator": "specsim.trace.synth.synth_trace",
        "specsim_version": __version__,
        "n_requests": n_requests,
        "gamma": gamma,
        "accept_profile": [float(x) for x in m],
        "auroc_target": auroc,
        "concentration": concentration,
        "expected_auroc": auroc_for(m, concentration, levels),
        "calibration": calibration if calibration == "calibrated" else factor,
        "seed": seed,
        "prompt_len": _describe(prompt_len),
        "output_len": _describe(output_len),
        "vocab": vocab,
        "levels": levels,
        "category": category,
        "draft_tokens": f"random ids, Zipf({ZIPF_EXPONENT}) mod vocab, meaningless",
    }
    if mixture is not None:  # only when used: the shipped traces' metadata stays as made
        params["mixture"] = [[float(w), [float(x) for x in p]] for w, p in mixture]
    if decay_to is not None:
        params["decay_to"] = float(decay_to)
    meta = {
        "specsim.trace_version": TRACE_VERSION,
        "block_size": str(gamma),
        "temperature": repr(float(temperature)),
        "target": "synthetic",
        "drafter": "synthetic beta-bernoulli",
        "source": "synthetic",
        "specsim.synth": json.dumps(params, sort_keys=True),
    }
    return Trace(
        request_ids=np.arange(n_requests, dtype=np.int64),
        prompt_len=in_len.astype(np.int32),
        output_len=out_len.astype(np.int32),
        offsets=offsets,
        conf=conf.astype(np.float32),
        accept_len=accept_len,
        draft_tokens=drafts,
        category=None if category is None else np.full(n_requests, category, dtype=object),
        meta=meta,
    )
