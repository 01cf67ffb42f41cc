"""llama-server's engine steps, rebuilt from what the client saw of a run.

Why: a profile of the server has to be measured from outside (the server logs no steps), and
per-request numbers average over many steps of different shapes. Every generating slot of
llama-server is in every step's batch (``update_slots``: one ``llama_decode`` over all of them
and the prompt chunks), so a request's streamed tokens fall into one group per step from its
prefill on: the first token is its prefill's, then each step commits ``accepted + 1`` tokens,
where ``accepted`` is known exactly from the drafter's reconstruction over the request's own
output (:mod:`specsim.serve.ngram`). Aligning the requests' groups step by step (a request
prefilled at global step s has its k-th decode group at step s + k) gives every step's end time
and its exact make-up: which requests decoded, how many tokens each verified and emitted, at
what context, and which prompts were prefilled.

A step's end is the earliest client timestamp of its tokens (the least delayed one). Its start
is the previous step's end while a request was running in between; a step that starts an idle
server (nothing running after the previous step) has no known start and no duration.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specsim.serve.bench_config import Result

# a group may sit this far from its step's time, as a fraction of the gap to the neighbours
TOLERANCE = 0.45


@dataclass(frozen=True)
class Group:
    """One request's tokens of one step."""

    t: float  # client time of the first token of the group
    req: int
    pos: int  # output tokens committed before the step (0: the prefill)
    verified: int  # 1 + drafted (decode), 0 (prefill)
    emitted: int
    context: int  # prompt + committed tokens
    last: bool = False  # the request's final group


def request_groups(
    req: int,
    res: Result,
    prompt_len: int,
    drafted: np.ndarray | None,
    accepted: np.ndarray | None,
) -> list[Group] | None:
    """A request's groups, or None when its stream does not hold its tokens one by one."""
    if res.error or not res.chunk_s:
        return None
    counts = np.asarray(res.chunk_tokens, dtype=np.int64)
    t = np.repeat(np.asarray(res.chunk_s, dtype=np.float64), counts)
    length = int(t.shape[0])
    if length < 1 or length != res.output_tokens:
        return None
    out = [Group(float(t[0]), req, 0, 0, 1, prompt_len, last=length == 1)]
    n = 1
    while n < length:
        d = int(drafted[n]) if drafted is not None else 0
        a = int(accepted[n]) if accepted is not None else 0
        e = min(a + 1, length - n)
        out.append(Group(float(t[n]), req, n, 1 + d, e, prompt_len + n, last=n + e >= length))
        n += e
    return out


def align(groups: Sequence[list[Group]]) -> tuple[list[list[Group]], float]:
    """Global steps (each a list of groups), aligned as the server batches them; and the worst
    misfit (a group's distance to its step's time over the gap to the next step; <= 0.5 when
    the alignment is consistent)."""
    order = sorted((g for g in groups if g), key=lambda gs: gs[0].t)
    steps: list[list[Group]] = []
    times: list[float] = []
    worst = 0.0
    for gs in order:
        s0 = _match(times, gs[0].t)
        for k, g in enumerate(gs):
            s = s0 + k
            if s < len(steps):
                steps[s].append(g)
                times[s] = min(times[s], g.t)
            else:
                steps.append([g])
                times.append(g.t)
    for s, members in enumerate(steps):
        gap = _gap(times, s)
        for g in members:
            worst = max(worst, abs(g.t - times[s]) / gap)
    return steps, worst


def _gap(times: list[float], s: int) -> float:
    gaps = [abs(times[s] - times[j]) for j in (s - 1, s + 1) if 0 <= j < len(times)]
    return max(min(gaps), 1e-6) if gaps else 1.0


def _match(times: list[float], t: float) -> int:
    """The step a request prefilled at time ``t`` joins: the nearest existing step within the
    tolerance, else a new one at the end."""
    if not times:
        return 0
    arr = np.asarray(times)
    s = int(np.argmin(np.abs(arr - t)))
    if abs(arr[s] - t) <= TOLERANCE * _gap(times, s):
        return s
    return len(times)


def step_table(steps: list[list[Group]], sent: dict[int, float]):  # noqa: ANN201 - DataFrame
    """One row per global step: its end (and start, NaN after an idle server), the decoders'
    count, verified and emitted tokens, mean and token-weighted context, the prompts prefilled,
    and the requests running (decoding + prefilling). ``sent``: request -> client send time."""
    import pandas as pd

    rows = []
    prev_end = np.nan
    busy = False  # a request was still running after the previous step
    for members in steps:
        dec = [g for g in members if g.pos > 0]
        pf = [g for g in members if g.pos == 0]
        end = min(g.t for g in members)
        start = prev_end if busy else np.nan
        verified = sum(g.verified for g in dec)
        rows.append(
            {
                "end_s": end,
                "start_s": start,
                "duration_s": end - start,
                "decoding": len(dec),
                "prefilling": len(pf),
                "running": len(dec) + len(pf),
                "batch_tokens": verified,  # the simulator's n_dec + n_ver
                "emitted": sum(g.emitted for g in dec),
                "prefill_tokens": sum(g.context for g in pf),
                "ctx_mean": float(np.mean([g.context for g in dec])) if dec else 0.0,
                "ctx_weighted": float(sum(g.verified * g.context for g in dec)),
                "first_sent_s": min((sent[g.req] for g in pf), default=np.nan),
            }
        )
        busy = any(not g.last for g in members)  # then the server starts the next at once
        prev_end = end
    return pd.DataFrame(rows)
