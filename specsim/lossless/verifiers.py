"""Reference verifiers in numpy, each driven by explicit uniforms.

Why explicit uniforms: the same code is then sampled (random uniforms, for the statistical
checks) and integrated exactly (uniforms placed on a grid of cells, see :mod:`uniforms`).

Block verifier protocol (vectorised over N independent cases)::

    verify(p, q, x, u, v) -> (n_accepted, token)

    p: (N, l+1, V)  target law at draft positions 1..l and at the bonus position l+1
    q: (N, l, V)    the law each draft token x_k was ACTUALLY drawn from
    x: (N, l)       the verified draft tokens (l may be 0)
    u: (N, l)       acceptance uniforms in [0, 1), one per position
    v: (N,)         uniform in [0, 1) for the one token sampled at the end
    n_accepted: (N,) in [0, l]; token: (N,) the recovered token at position n+1 (after a
    rejection) or the bonus token (all l accepted). Emitted: x_1..x_n, token.

Multi-draft protocol (one position, k candidate drafts)::

    verify(p, q, xs, u, v) -> token       p, q: (N, V); xs, u: (N, k); v: (N,)

Correct and lossless: :func:`rejection`, :func:`greedy` (at temperature 0 the target law is the
argmax; ties go to the lowest token id), :func:`specinfer` (i.i.d. drafts) and
:func:`rrs_without_replacement`. Lossy by design (negative controls): :func:`typical` (Medusa's
typical acceptance) and :func:`thresholded`.
"""

from __future__ import annotations

import numpy as np


def sample_from(law: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Inverse-CDF sampling, (N, V) laws and (N,) uniforms -> (N,) tokens.

    Never returns a zero-probability token: v = 0 picks the first token with mass (side
    "right"), and rounding at v -> 1 is clipped to the last token with mass.
    """
    cdf = np.cumsum(law, axis=-1)
    scaled = v * cdf[:, -1]
    idx = (cdf <= scaled[:, None]).sum(axis=-1)
    last = law.shape[-1] - 1 - np.argmax((law > 0)[:, ::-1], axis=-1)
    return np.minimum(idx, last)


def normalise(mass: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """Rows of ``mass`` scaled to sum 1; a row with no mass falls back (only on null events,
    e.g. the residual when p == q, which a correct verifier reaches with probability 0)."""
    total = mass.sum(axis=-1, keepdims=True)
    return np.where(total > 0, mass / np.where(total > 0, total, 1.0), fallback)


def acceptance_ratio(p: np.ndarray, q: np.ndarray, x: np.ndarray) -> np.ndarray:
    """min(1, p(x)/q(x)) for each verified position, (N, l)."""
    px = np.take_along_axis(p[:, : x.shape[1]], x[..., None], axis=-1)[..., 0]
    qx = np.take_along_axis(q, x[..., None], axis=-1)[..., 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(qx > 0, px / np.where(qx > 0, qx, 1.0), (px > 0).astype(np.float64))
    return np.minimum(ratio, 1.0)


def first_rejection(accepted: np.ndarray) -> np.ndarray:
    """Index of the first False in each row of (N, l), or l when all are True."""
    n, length = accepted.shape
    if length == 0:
        return np.zeros(n, dtype=np.int64)
    return np.where(accepted.all(axis=1), length, np.argmin(accepted, axis=1)).astype(np.int64)


def final_law(p: np.ndarray, q: np.ndarray, n: np.ndarray, residual_fn=None) -> np.ndarray:
    """Law of the last emitted token: the residual at a rejected position n < l, p_{l+1} after
    full acceptance. ``residual_fn(p_n, q_n) -> (N, V)`` defaults to norm(max(p - q, 0))."""
    rows = np.arange(n.shape[0])
    length = q.shape[1]
    law = p[rows, n].copy()  # the bonus law p_{l+1} where n == l
    if length == 0:
        return law
    rejected = n < length
    k = np.minimum(n, length - 1)
    p_n, q_n = p[rows, k], q[rows, k]
    if residual_fn is None:
        residual = normalise(np.maximum(p_n - q_n, 0.0), p_n)
    else:
        residual = residual_fn(p_n, q_n)
    return np.where(rejected[:, None], residual, law)


def rejection(p, q, x, u, v):
    """Block rejection sampling: accept x_k with probability min(1, p/q) (u_k < ratio, strict so
    that u = 0 never accepts a zero-probability token), residual norm(max(p - q, 0)) at the
    first rejection, bonus from p_{l+1} when all l are accepted."""
    n = first_rejection(u < acceptance_ratio(p, q, x))
    return n, sample_from(final_law(p, q, n), v)


def greedy(p, q, x, u, v):
    """Temperature 0: accept x_k iff it is the argmax of p_k (lowest id on ties); the last token
    is the argmax at the first mismatch or at the bonus position. Uses no uniforms."""
    best = np.argmax(p, axis=-1)  # (N, l+1), first maximum
    n = first_rejection(x == best[:, : x.shape[1]])
    return n, best[np.arange(n.shape[0]), n]


TYPICAL_EPSILON = 0.3
TYPICAL_DELTA = 0.09


def typical(p, q, x, u, v):
    """Medusa's typical acceptance (LOSSY by design): accept x_k when p_k(x_k) exceeds
    min(epsilon, delta * exp(-H(p_k))); then sample the next token from p."""
    px = np.take_along_axis(p[:, : x.shape[1]], x[..., None], axis=-1)[..., 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=-1)
    bar = np.minimum(TYPICAL_EPSILON, TYPICAL_DELTA * np.exp(-ent[:, : x.shape[1]]))
    n = first_rejection(px > bar)
    return n, sample_from(p[np.arange(n.shape[0]), n], v)


ACCEPT_THRESHOLD = 0.5


def thresholded(p, q, x, u, v):
    """Deterministic acceptance when min(1, p/q) >= 0.5, residual otherwise (LOSSY by design:
    what "acceptance threshold below 1" modes do)."""
    n = first_rejection(acceptance_ratio(p, q, x) >= ACCEPT_THRESHOLD)
    return n, sample_from(final_law(p, q, n), v)


def specinfer(p, q, xs, u, v):
    """SpecInfer multi-draft, i.i.d. drafts x_i ~ q: try them in turn against the current target
    p_i; after a rejection p_{i+1} = norm(max(p_i - q, 0)); if all fail, sample from p_k."""
    cur = p.copy()
    token = np.full(xs.shape[0], -1, dtype=np.int64)
    rows = np.arange(xs.shape[0])
    for i in range(xs.shape[1]):
        xi = xs[:, i]
        open_ = token < 0
        ratio = np.minimum(1.0, cur[rows, xi] / np.where(q[rows, xi] > 0, q[rows, xi], 1.0))
        hit = open_ & (u[:, i] < ratio)
        token[hit] = xi[hit]
        nxt = normalise(np.maximum(cur - q, 0.0), cur)
        cur = np.where((open_ & ~hit)[:, None], nxt, cur)
    rest = token < 0
    token[rest] = sample_from(cur[rest], v[rest])
    return token


def rrs_without_replacement(p, q, xs, u, v):
    """Recursive rejection sampling for drafts drawn WITHOUT replacement: draft i is drawn from
    q_i = q renormalised over the untried tokens and verified against p_i; after a rejection
    p_{i+1} = norm(max(p_i - q_i, 0)) and x_i leaves q."""
    cur_p = p.copy()
    cur_q = q.copy()
    token = np.full(xs.shape[0], -1, dtype=np.int64)
    rows = np.arange(xs.shape[0])
    for i in range(xs.shape[1]):
        xi = xs[:, i]
        open_ = token < 0
        qx = cur_q[rows, xi]
        ratio = np.minimum(1.0, cur_p[rows, xi] / np.where(qx > 0, qx, 1.0))
        hit = open_ & (u[:, i] < ratio)
        token[hit] = xi[hit]
        miss = (open_ & ~hit)[:, None]
        cur_p = np.where(miss, normalise(np.maximum(cur_p - cur_q, 0.0), cur_p), cur_p)
        dropped = cur_q.copy()
        dropped[rows, xi] = 0.0
        cur_q = np.where(miss, normalise(dropped, cur_q), cur_q)
    rest = token < 0
    token[rest] = sample_from(cur_p[rest], v[rest])
    return token


BLOCK_VERIFIERS = {
    "rejection": rejection,
    "greedy": greedy,
    "typical": typical,
    "thresholded": thresholded,
}
MULTI_VERIFIERS = {"specinfer": specinfer, "rrs-without-replacement": rrs_without_replacement}
