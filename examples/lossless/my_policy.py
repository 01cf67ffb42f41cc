"""A user's prefix scheduler, checked for losslessness by ``specsim check-lossless``.

Covers: the policy callable interface (``schedule(inp: StepInput) -> lengths``).
Scenario: verify each request's drafts while its survival a_k = c_1 * ... * c_k stays above a
floor that rises with the batch size (busy GPU: verify less).

    PYTHONPATH=examples/lossless specsim check-lossless --policy my_policy:survival_floor

It is lossless because admitting draft k looks at c_1..c_k only (non-anticipating).
``peeking`` looks one position ahead (c_{k+1}, which depends on the draft x_k): lossy.
``random_length`` draws its length from its own stream ``inp.rng``: proven lossless (the checker
integrates over the stream); ``unseeded_random`` draws from numpy's global generator: refused.
"""

import numpy as np

FLOOR_PER_REQUEST = 0.1  # survival floor added per running request


def survival_floor(inp):
    survival = np.cumprod(inp.conf, axis=1)  # (R, gamma)
    floor = min(0.9, FLOOR_PER_REQUEST * inp.n_requests)
    ok = survival >= floor
    return np.cumprod(ok, axis=1).sum(axis=1)  # leading run of admitted positions


def peeking(inp):
    """Admit draft k only if the NEXT confidence c_{k+1} is high: reads the future."""
    nxt = np.concatenate([inp.conf[:, 1:], np.ones((inp.n_requests, 1))], axis=1)
    return np.cumprod(nxt >= 0.5, axis=1).sum(axis=1)


def random_length(inp):
    """A random policy done right: the length is drawn from the policy's own stream inp.rng,
    independently of the drafts. Lossless; the checker integrates over the stream."""
    return inp.rng.integers(0, inp.gamma + 1, size=inp.n_requests)


def unseeded_random(inp):
    """A random policy done wrong: it draws from numpy's global generator, so the checker cannot
    integrate over its randomness and refuses it (exit 2, one line)."""
    return np.random.randint(0, inp.gamma + 1, size=inp.n_requests)  # noqa: NPY002 (the bug)
