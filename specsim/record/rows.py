"""What a recording makes per request, and the settings it runs with.

Apart from ``recorder.py`` so that the greedy and sampled paths (``sampled.py``) both build on it
and the recorder imports them, never the other way round.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RecordConfig:
    """How a trace is recorded: sampling temperature, output cap, batching, seed, resume chunk."""

    temperature: float = 0.0
    max_new_tokens: int = 256
    batch_size: int = 16
    seed: int = 0
    chunk: int = 8  # requests per resume checkpoint


@dataclass(frozen=True)
class RequestRows:
    """The trace rows of one request (column arrays)."""

    draft_tokens: np.ndarray  # [L, gamma] int32
    confidence: np.ndarray  # [L, gamma] float32
    accept_len: np.ndarray  # [L] int16
    accept_prob: np.ndarray | None = None  # [L, gamma] float32
