"""Named random streams from one seed.

Each consumer (arrivals, request sampling, synthetic traces, ...) draws from its own
``numpy.random.Generator`` derived from ``(seed, name)``. Adding a new consumer therefore never
shifts the numbers another one sees, and the same seed gives the same result bit for bit.
"""

from __future__ import annotations

import zlib

import numpy as np

from specsim.errors import SpecsimError

MAX_SEED = 2**63 - 1


def check_seed(seed: object) -> int:
    """A seed as an int in [0, 2^63), or a one-line error (``--seed -1`` is not a seed)."""
    try:
        value = int(seed)  # type: ignore[call-overload]
    except (TypeError, ValueError, OverflowError):
        raise SpecsimError(f"--seed must be a whole number >= 0, got {seed!r}") from None
    if value != seed or not 0 <= value <= MAX_SEED:
        raise SpecsimError(f"--seed must be a whole number in [0, 2^63), got {seed!r}")
    return value


def stream(seed: int, name: str) -> np.random.Generator:
    """A Generator for the stream ``name`` of ``seed`` (stable across runs and platforms)."""
    key = zlib.crc32(name.encode("utf-8"))
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([check_seed(seed), key])))
