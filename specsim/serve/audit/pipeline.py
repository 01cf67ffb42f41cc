"""Generation and scoring as two stages, each with its own requests in flight (issue 46).

Why: an audit at T > 0 costs, per position, one emitted token on the audited server and one
one-token decode on the reference. When one worker generated a request and then scored it,
the two servers took turns: while a worker scored, its request was not in flight on the audited
server, and the reference decoded at most one position per worker. Two stages keep both busy:
``n_gen`` generators keep that many requests in flight on the audited server (its batch mates,
the concurrency the audit tests), and ``n_score`` scorers, each pinned to its own reference slot
(so the prompt cache makes every position a one-token decode after the cached prefix), score
finished generations in parallel, which llama-server batches into one decode. A bounded queue
between them keeps generation at most ``n_score`` requests ahead of scoring.

Nothing here decides what is counted: ``absorb`` receives each job with its scores, and the
audit counts jobs in job order, so the verdict does not depend on which stage was faster.
``Busy`` measures where the wall time went (each stage's share of its workers' time in a
request): the stage near 100% is the one that sets the rate.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from specsim.serve.stoppable import gather_all

G = TypeVar("G")  # what a generation gives to its scoring
S = TypeVar("S")  # what scoring gives to absorb


@dataclass
class Busy:
    """Seconds each stage spent in requests, and the wall time, of one run of the pipeline."""

    n_gen: int = 0
    n_score: int = 0
    generate_s: float = 0.0
    score_s: float = 0.0
    wall_s: float = 0.0

    def shares(self) -> tuple[float, float]:
        """Share of each stage's worker time spent in a request (generation, scoring): the one
        near 1 is the bottleneck; the other waited for it."""

        def share(busy: float, n: int) -> float:
            return busy / (n * self.wall_s) if n and self.wall_s > 0 else float("nan")

        return share(self.generate_s, self.n_gen), share(self.score_s, self.n_score)

    def text(self) -> str:
        g, s = self.shares()
        return (
            f"time in requests: audited server {g:.0%} of {self.n_gen} generator(s), "
            f"reference {s:.0%} of {self.n_score} scorer(s)"
        )


@dataclass(frozen=True)
class Stages(Generic[G, S]):
    """The audit's side of the pipeline (all but ``claim`` and ``stop`` are coroutines)."""

    claim: Callable[[], int | None]  # the next job to generate, None: start no more
    generate: Callable[[int, int], Awaitable[G]]  # (generator index, job) -> generation
    score: Callable[[int, int, G], Awaitable[S]]  # (scorer index = its slot, job, generation)
    absorb: Callable[[int, G, S], None]  # a scored job (any order: the caller orders them)
    stop: Callable[[], bool]  # a verdict is in: score nothing more


async def run_pipeline(stages: Stages[Any, Any], busy: Busy) -> Busy:
    """Run ``busy.n_gen`` generators and ``busy.n_score`` scorers until ``claim`` gives None and
    every generated job is scored (or ``stop``); ``busy`` is filled in as it goes (the caller
    keeps it when a signal cancels the run). The first failure of any worker cancels the
    others (``gather_all``) and propagates."""
    n_gen, n_score = busy.n_gen, busy.n_score
    if n_gen < 1 or n_score < 1:
        raise ValueError(f"a pipeline needs >= 1 generator and scorer, got {n_gen}, {n_score}")
    q: asyncio.Queue[tuple[int, Any] | None] = asyncio.Queue(maxsize=n_score)
    t0 = time.monotonic()

    async def generator(w: int) -> None:
        while not stages.stop():
            j = stages.claim()
            if j is None:
                return
            t = time.monotonic()
            g = await stages.generate(w, j)
            busy.generate_s += time.monotonic() - t
            await q.put((j, g))

    async def generators() -> None:
        await gather_all([generator(w) for w in range(n_gen)])
        for _ in range(n_score):  # one end mark per scorer, after every generated job
            await q.put(None)

    async def scorer(s: int) -> None:
        while (item := await q.get()) is not None:
            j, g = item
            if stages.stop():
                continue  # drain: the verdict is in
            t = time.monotonic()
            sc = await stages.score(s, j, g)
            busy.score_s += time.monotonic() - t
            stages.absorb(j, g, sc)

    try:
        await gather_all([generators(), *(scorer(s) for s in range(n_score))])
    finally:
        busy.wall_s = time.monotonic() - t0
    return busy
