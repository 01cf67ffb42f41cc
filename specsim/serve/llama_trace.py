"""Traces of llama-server's own speculative steps, for the simulator to replay.

A llama.cpp drafter's block varies in length: an n-gram drafter drafts nothing where its
n-gram has no earlier match and fewer than n-max tokens near the end of the history, a DSpark
block is cut before the first raw confidence under ``--spec-draft-p-min``, and every draft is
cut to the request's remaining tokens minus one. The trace says which draft tokens the server
verifies through the confidences: 1 for a token the server verifies, 0 for one it does not, so
``threshold:0.5`` (cut at the first confidence under 0.5) verifies exactly the server's block,
at every load; ``accept_len`` is how many of them the server accepts (never more than it
verifies). ``none`` has one dummy draft position and is replayed with ``ar``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specsim.trace.model import Trace

# the policy that verifies what llama-server verifies, given a trace built here
VERIFY_AS_SERVER = "threshold:0.5"


def build_trace(
    prompt_len: Sequence[int],
    output_len: Sequence[int],
    drafted: Sequence[np.ndarray] | None,
    accepted: Sequence[np.ndarray] | None,
    tokens: Sequence[np.ndarray] | None,
    block: int,
    meta: dict[str, str],
    category: Sequence[str] | None = None,
) -> Trace:
    """One trace row per output position of every request: ``drafted[i][n]`` tokens verified
    at position n of request i (``tokens[i][n, :drafted]`` their ids), ``accepted[i][n]`` of
    them accepted. ``drafted is None``: no speculation (``none``: a block of 1, nothing
    verified)."""
    lens = np.asarray(output_len, dtype=np.int64)
    rows = int(lens.sum())
    offsets = np.zeros(lens.shape[0] + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    conf = np.zeros((rows, block), dtype=np.float32)
    acc = np.zeros(rows, dtype=np.int16)
    ids = np.zeros((rows, block), dtype=np.int32)
    if drafted is not None:
        assert accepted is not None and tokens is not None
        k = np.arange(block)
        for i, (d, a, t) in enumerate(zip(drafted, accepted, tokens, strict=True)):
            lo, hi = offsets[i], offsets[i + 1]
            d = np.asarray(d, dtype=np.int64)
            a = np.asarray(a, dtype=np.int64)
            if d.shape[0] != hi - lo or np.any(a > d) or np.any(d > block):
                raise ValueError(f"request {i}: drafted/accepted do not fit its output or block")
            conf[lo:hi] = k[None, :] < d[:, None]
            acc[lo:hi] = a
            t = np.asarray(t, dtype=np.int64)[:, :block]
            ids[lo:hi, : t.shape[1]] = np.where(k[None, : t.shape[1]] < d[:, None], t, 0)
    return Trace(
        request_ids=np.arange(lens.shape[0], dtype=np.int64),
        prompt_len=np.asarray(prompt_len, dtype=np.int32),
        output_len=lens.astype(np.int32),
        offsets=offsets,
        conf=conf,
        accept_len=acc,
        draft_tokens=ids,
        category=None if category is None else np.asarray(category, dtype=object),
        meta={"source": "recorded", "block_size": str(block), **meta},
    )


def path_counts(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Per request, (drafted, accepted) along llama-server's walk through the trace (full
    verification from position 1): what its timings' ``draft_n`` / ``draft_n_accepted`` are
    predicted to be."""
    verified = (trace.conf >= 0.5).sum(axis=1)
    d_out = np.zeros(trace.n_requests, dtype=np.int64)
    a_out = np.zeros(trace.n_requests, dtype=np.int64)
    for i in range(trace.n_requests):
        lo, length = int(trace.offsets[i]), int(trace.output_len[i])
        n = 1
        while n < length:
            d_out[i] += int(verified[lo + n])
            a = int(trace.accept_len[lo + n])
            a_out[i] += a
            n += a + 1
    return d_out, a_out
