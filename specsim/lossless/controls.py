"""Correct but unusual verifiers: the checks must NOT call these lossy.

Each computes rejection sampling in a way that moves or reshapes its thresholds, so a checker
that only knows the textbook thresholds would mis-integrate or refuse them:

- :func:`log_space`: accept when log u < log p(x) - log q(x);
- :func:`sorted_inverse_cdf`: the last token by inverse CDF over tokens sorted by decreasing mass;
- :func:`one_minus_u`: uses 1 - u and 1 - v (same law as u and v, mirrored thresholds);
- :func:`gumbel_max`: draws its own randomness (``rng``) and samples the last token by Gumbel-max
  over V exponential keys; only the statistical check can see it.
"""

from __future__ import annotations

import numpy as np

from specsim.lossless.verifiers import acceptance_ratio, final_law, first_rejection, sample_from


def log_space(p, q, x, u, v):
    """Rejection sampling with the acceptance test in log space."""
    px = np.take_along_axis(p[:, : x.shape[1]], x[..., None], axis=-1)[..., 0]
    qx = np.take_along_axis(q, x[..., None], axis=-1)[..., 0]
    with np.errstate(divide="ignore"):
        accept = np.log(u) < np.log(px) - np.log(np.where(qx > 0, qx, 1.0))
    n = first_rejection(accept & (px > 0))
    return n, sample_from(final_law(p, q, n), v)


def sorted_inverse_cdf(p, q, x, u, v):
    """Rejection sampling; the last token by inverse CDF over the tokens sorted by decreasing
    probability (what a top-p style kernel does)."""
    n = first_rejection(u < acceptance_ratio(p, q, x))
    law = final_law(p, q, n)
    order = np.argsort(-law, axis=-1, kind="stable")
    picked = sample_from(np.take_along_axis(law, order, axis=-1), v)
    return n, order[np.arange(n.shape[0]), picked]


def one_minus_u(p, q, x, u, v):
    """Rejection sampling fed 1 - u and 1 - v (in (0, 1]; the last token clipped to mass)."""
    n = first_rejection(1.0 - u < acceptance_ratio(p, q, x))
    return n, sample_from(final_law(p, q, n), np.minimum(1.0 - v, np.nextafter(1.0, 0.0)))


def gumbel_max(p, q, x, rng):
    """Rejection sampling drawing its own uniforms; the last token by Gumbel-max (argmax of
    log law + Gumbel noise, i.e. argmin of Exp(1) / law)."""
    n_cases, length = x.shape
    n = first_rejection(rng.random((n_cases, length)) < acceptance_ratio(p, q, x))
    law = final_law(p, q, n)
    keys = rng.exponential(size=law.shape)
    with np.errstate(divide="ignore"):
        score = np.where(law > 0, keys / np.where(law > 0, law, 1.0), np.inf)
    return n, np.argmin(score, axis=-1)


UNIFORM_CONTROLS = {
    "log-space": log_space,
    "sorted-inverse-cdf": sorted_inverse_cdf,
    "one-minus-u": one_minus_u,
}
