"""Named random streams from one seed.

Each consumer (arrivals, request sampling, synthetic traces, ...) draws from its own
``numpy.random.Generator`` derived from ``(seed, name)``. Adding a new consumer therefore never
shifts the numbers another one sees, and the same seed gives the same result bit for bit.
"""

from __future__ import annotations

import zlib

import numpy as np


def stream(seed: int, name: str) -> np.random.Generator:
    """A Generator for the stream ``name`` of ``seed`` (stable across runs and platforms)."""
    key = zlib.crc32(name.encode("utf-8"))
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed), key])))
