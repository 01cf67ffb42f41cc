"""A user's verifier, written the way an engine would, checked by ``specsim check-lossless``.

Covers: the verifier callable interface (docs/losslessness.md).
Scenario: you have your own rejection sampler and want to know it is lossless before shipping it.

    PYTHONPATH=examples/lossless specsim check-lossless --verifier my_verifier:verify

Shapes (N independent cases, l verified drafts, vocabulary V):
    p: (N, l+1, V) target laws at draft positions 1..l and at the bonus position l+1
    q: (N, l, V)   the laws the drafts were drawn from
    x: (N, l)      draft tokens
    u: (N, l)      one acceptance uniform per position, in [0, 1)
    v: (N,)        the uniform for the token sampled at the end
Returns (n_accepted (N,), token (N,)): the emitted tokens are x[:n_accepted] then token.
"""

import numpy as np


def _sample(law, v):
    # Inverse CDF; side="right" so that v = 0 never picks a zero-probability token.
    cdf = np.cumsum(law, axis=1)
    idx = (cdf <= (v * cdf[:, -1])[:, None]).sum(axis=1)
    return np.minimum(idx, law.shape[1] - 1 - np.argmax(law[:, ::-1] > 0, axis=1))


def verify(p, q, x, u, v):
    """Correct block rejection sampling."""
    n_cases, length = x.shape
    rows = np.arange(n_cases)
    n = np.full(n_cases, length)
    for k in range(length - 1, -1, -1):  # first rejection wins: scan backwards
        px, qx = p[rows, k, x[:, k]], q[rows, k, x[:, k]]
        rejected = u[:, k] * qx >= px  # u < p/q  <=>  u q < p  (q > 0: x was drawn from q)
        n = np.where(rejected, k, n)
    law = p[rows, n].copy()  # bonus law where everything was accepted
    at = np.minimum(n, max(length - 1, 0))
    if length:
        resid = np.maximum(p[rows, at] - q[rows, at], 0.0)
        mass = resid.sum(axis=1, keepdims=True)
        resid = np.where(mass > 0, resid / np.where(mass > 0, mass, 1.0), p[rows, at])
        law = np.where((n < length)[:, None], resid, law)
    return n, _sample(law, v)


def verify_rng(p, q, x, rng):
    """The same verifier drawing its own uniforms: only the statistical checks can run."""
    return verify(p, q, x, rng.random(x.shape), rng.random(x.shape[0]))


def verify_buggy(p, q, x, u, v):
    """A typical slip: after a rejection, sample the recovered token from p."""
    n, _ = verify(p, q, x, u, v)
    return n, _sample(p[np.arange(x.shape[0]), n], v)
