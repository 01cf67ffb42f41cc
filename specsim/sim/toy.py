"""Toy traces with a known answer, for analytical checks of the simulator.

``iid_trace``: every draft position of every row is accepted independently with probability
alpha, so a request verifying K drafts per step emits (1 - alpha^(K+1)) / (1 - alpha) tokens
per step on average. The confidences are all alpha (a calibrated but uninformative drafter).
"""

from __future__ import annotations

import numpy as np

from specsim.rng import stream
from specsim.trace.model import Trace


def iid_trace(
    n_requests: int,
    output_len: int | np.ndarray,
    *,
    gamma: int = 7,
    alpha: float = 0.7,
    prompt_len: int | np.ndarray = 128,
    seed: int = 0,
    conf: float | None = None,
) -> Trace:
    """A trace of ``n_requests`` with i.i.d. acceptance ``alpha`` (confidence ``conf`` or alpha)."""
    out = np.broadcast_to(np.asarray(output_len, dtype=np.int32), (n_requests,)).copy()
    prompt = np.broadcast_to(np.asarray(prompt_len, dtype=np.int32), (n_requests,)).copy()
    offsets = np.zeros(n_requests + 1, dtype=np.int64)
    np.cumsum(out, out=offsets[1:])
    rows = int(offsets[-1])
    ok = stream(seed, "toy.accept").random((rows, gamma)) < alpha
    accept_len = np.cumprod(ok, axis=1).sum(axis=1).astype(np.int16)
    c = np.full((rows, gamma), alpha if conf is None else conf, dtype=np.float32)
    return Trace(
        request_ids=np.arange(n_requests, dtype=np.int64),
        prompt_len=prompt,
        output_len=out,
        offsets=offsets,
        conf=c,
        accept_len=accept_len,
        draft_tokens=np.zeros((rows, gamma), dtype=np.int32),  # ids carry no meaning here
        meta={"block_size": str(gamma), "source": "synthetic", "generator": f"iid_trace({alpha})"},
    )
