"""llama.cpp's ``--spec-type ngram-simple`` drafter, ported exactly, and the steps llama-server
takes with it over a given output.

Why a port: the simulator needs, at every output position of a request, the draft llama-server
would verify there and how much of it the server accepts. The n-gram drafter is a deterministic
function of the token history, so given the server's own output tokens (greedy, or a seeded
sample at T > 0: the server accepts a draft iff it equals the target's sample,
``common_sampler_sample_and_accept_n``), the drafts and acceptances are reconstructed here
position by position and checked against the server's per-request ``draft_n`` /
``draft_n_accepted`` (tests/test_llama_ngram.py).

Source (llama.cpp build 11434): ``common/ngram-map.cpp`` (``common_ngram_simple_draft``),
``common/speculative.cpp`` (the draft is cut to the slot's ``n_max``), and
``tools/server/server-context.cpp`` (``get_n_draft_max``: ``min(n_ctx_slot - n_tokens - 2,
n_remaining - 1)``; the history is the prompt and every committed token but the last sampled
one, which is passed apart as ``sampled``). Note what llama.cpp does with the two sizes: the
lookup n-gram is ``size_n`` tokens, the draft at most ``size_m``, and a match whose
continuation is shorter than ``size_n`` drafts nothing (so ``size_m < size_n`` never drafts);
``--spec-draft-n-max`` does not apply to n-gram drafters, ``--spec-ngram-simple-size-m`` is
their n-max.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from specsim.errors import SpecsimError


@dataclass(frozen=True)
class NgramSimple:
    """``--spec-type ngram-simple`` with lookup size ``size_n`` and draft size ``size_m``
    (llama.cpp's defaults are 12 and 48)."""

    size_n: int = 12
    size_m: int = 48

    def __post_init__(self) -> None:
        if not (1 <= self.size_n <= 1024 and 1 <= self.size_m <= 1024):
            raise SpecsimError(
                f"ngram sizes must be in [1, 1024] (llama.cpp's range), got n={self.size_n} "
                f"m={self.size_m}"
            )
        if self.size_m < self.size_n:
            raise SpecsimError(
                f"ngram-simple with size_m {self.size_m} < size_n {self.size_n} never drafts "
                "(llama.cpp drops a continuation shorter than the lookup n-gram); lower size_n"
            )

    def server_args(self) -> tuple[str, ...]:
        """The llama-server flags that select this drafter."""
        return (
            "--spec-type",
            "ngram-simple",
            "--spec-ngram-simple-size-n",
            str(self.size_n),
            "--spec-ngram-simple-size-m",
            str(self.size_m),
        )

    def draft(self, tokens: np.ndarray, sampled: int) -> np.ndarray:
        """``common_ngram_simple_draft(tokens, sampled)``: the latest earlier occurrence of the
        last ``size_n`` tokens (``sampled`` last) and up to ``size_m`` tokens after it."""
        n, m = self.size_n, self.size_m
        cur = int(tokens.shape[0])
        if cur <= n + m + 1:
            return tokens[:0]
        pattern = np.empty(n, dtype=tokens.dtype)
        pattern[: n - 1] = tokens[cur - n + 1 :]
        pattern[n - 1] = sampled
        # the C loop scans j = cur - n - 1 down to 1 and stops at the first match: the largest
        win = sliding_window_view(tokens[: cur - 1], n)  # windows j = 0 .. cur - n - 1
        hits = np.flatnonzero((win[1:] == pattern).all(axis=1))
        if hits.size == 0:
            return tokens[:0]
        j = int(hits[-1]) + 1
        copy = min(m, cur - (j + n))
        if copy < n:
            return tokens[:0]
        return tokens[j + n : j + n + copy]


@dataclass(frozen=True)
class Positions:
    """What the server would draft and accept at every output position of one request.

    ``drafted[n]`` / ``accepted[n]`` (n = committed output tokens, 0..L-1; position 0 is the
    prefill, which never drafts) and ``tokens[n]`` (the drafted ids, padded with -1)."""

    drafted: np.ndarray  # (L,) int64
    accepted: np.ndarray  # (L,) int64
    tokens: np.ndarray  # (L, size_m) int64, -1 where nothing was drafted


def positions(
    drafter: NgramSimple,
    prompt: list[int] | np.ndarray,
    output: list[int] | np.ndarray,
    n_ctx_slot: int = 1 << 30,
) -> Positions:
    """The draft at every position of a request whose output (``n_predict`` = its length) is
    ``output``, with the server's cut to ``min(n_ctx_slot - n_tokens - 2, n_remaining - 1)``
    and acceptance = the leading drafts equal to the output (T = 0: the argmax; T > 0: the
    server's own sample)."""
    p = np.asarray(prompt, dtype=np.int64)
    out = np.asarray(output, dtype=np.int64)
    length = int(out.shape[0])
    hist = np.concatenate((p, out))
    m = drafter.size_m
    drafted = np.zeros(length, dtype=np.int64)
    accepted = np.zeros(length, dtype=np.int64)
    toks = np.full((length, m), -1, dtype=np.int64)
    for n in range(1, length):
        n_tokens = p.shape[0] + n - 1  # the history before the sampled token out[n - 1]
        n_max = min(n_ctx_slot - n_tokens - 2, length - n - 1)
        if n_max <= 0:
            continue
        d = drafter.draft(hist[:n_tokens], int(out[n - 1]))[:n_max]
        k = int(d.shape[0])
        if not k:
            continue
        drafted[n] = k
        toks[n, :k] = d
        same = d == out[n : n + k]
        accepted[n] = k if same.all() else int(np.argmin(same))
    return Positions(drafted=drafted, accepted=accepted, tokens=toks)


def server_path(pos: Positions) -> tuple[int, int, int]:
    """(draft_n, draft_n_accepted, steps) of the server's walk: from position 1 it verifies
    the whole draft, commits accepted + 1 tokens and moves on (llama-server's timings)."""
    length = int(pos.drafted.shape[0])
    n, drafted, accepted, steps = 1, 0, 0, 0
    while n < length:
        drafted += int(pos.drafted[n])
        accepted += int(pos.accepted[n])
        steps += 1
        n += int(pos.accepted[n]) + 1
    return drafted, accepted, steps
