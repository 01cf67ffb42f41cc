"""llama-server's steps from its own log, on its own clock: the calibration's step table.

Why: :mod:`specsim.serve.llama_steps` rebuilds the steps from the client's chunk times, and on
a machine where the server holds every core the client is late by whatever the scheduler gives
it: at one request in flight the rebuilt steps priced a 4-token verify at about twice what the
server took (reports/llama-cpp-v4/PLAN.md, steps 2-2c). A server started with
:data:`specsim.serve.spec_log.ENV` / ``ARGS`` logs, on its microsecond clock, every task's
launch, every slot's step start (with its tokens and drafts) and every task's end.

How the lines become steps (llama.cpp b11434, ``update_slots``): one iteration launches the
tasks waiting (``processing task``), then walks the slots in index order, each decoding slot
logging its step (``generate_draft`` / ``slot decode token``; a draft-model slot after its
drafter ran), then decodes one batch and samples; a task's timings line follows the iteration
that sampled its last token. So an iteration starts at a launch, at a step line whose slot does
not follow the previous line's slot or whose task it launched, or after a task ended; it lasts
until the next iteration starts, or, when no task is left running, until the last task's
timings line (the server then waits for the client: idle time is no step's).

A row has the columns of :func:`specsim.serve.llama_steps.step_table` that the profile fit
reads: the decoders, their verified and emitted tokens and mean context, the prompt tokens
prefilled (each launched task's uncached part), the duration; and, which only the server's log
can say (it names each step's slots), the tokens of each forward pass the server cut the
decoders into (``passes``, e.g. ``"3 1"``: :mod:`specsim.sim.ubatch`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specsim.serve.spec_log import Task
from specsim.sim.ubatch import pass_text, ubatch_sizes

_END, _LAUNCH, _STEP = 0, 1, 2  # at one instant: an iteration ends before the next launches
SAME_ITERATION_S = 1e-3  # launches further apart are two iterations (one prefilled between)


def server_steps(tasks: Sequence[Task]):  # noqa: ANN201 - a DataFrame
    """The server's iterations over ``tasks`` (from :func:`specsim.serve.spec_log.parse`), one
    row each, in time order."""
    import pandas as pd

    events = []
    for k in tasks:
        events.append((k.launched_s, _LAUNCH, k.slot, k))
        for i, t in enumerate(k.t_s):
            events.append((t, _STEP, k.slot, (k, i)))
        if np.isfinite(k.ended_s):
            events.append((k.ended_s, _END, k.slot, k))
    events.sort(key=lambda e: e[:3])  # the log has microseconds: ties go in slot order
    groups: list[dict] = []
    running: set[int] = set()
    cur: dict | None = None
    last_slot = -1
    for t, kind, slot, what in events:
        if kind == _END:
            running.discard(what.task)
            if cur is not None:
                cur["ended_s"] = t
                if not running:  # idle until the next launch: the step ends here
                    cur["end_s"] = t
                    cur = None
            continue
        if cur is None or "ended_s" in cur:
            new = True
        elif kind == _LAUNCH:  # one iteration's launches come back to back
            new = bool(cur["steps"]) or t - cur["last_s"] > SAME_ITERATION_S
        else:
            new = slot <= last_slot or what[0] in cur["launched"]
        if new:
            if cur is not None and "end_s" not in cur:
                cur["end_s"] = t
            cur = {"start_s": t, "steps": [], "launched": []}
            groups.append(cur)
        if kind == _LAUNCH:
            running.add(what.task)
            cur["launched"].append(what)
            cur["last_s"] = t
            last_slot = -1
        else:
            cur["steps"].append(what)
            last_slot = slot
    return pd.DataFrame([_row(g) for g in groups if "end_s" in g])


def _row(g: dict) -> dict:
    dec = g["steps"]
    ctx = [k.n_tokens[i] for k, i in dec]
    verified = [1 + k.drafted[i] for k, i in dec]
    return {
        "end_s": g["end_s"],
        "start_s": g["start_s"],
        "duration_s": g["end_s"] - g["start_s"],
        "decoding": len(dec),
        "prefilling": len(g["launched"]),
        "running": len(dec) + len(g["launched"]),
        "batch_tokens": sum(verified),
        "emitted": sum(1 + k.accepted[i] for k, i in dec),
        "prefill_tokens": sum(max(k.prompt_n, 0) for k in g["launched"]),
        "ctx_mean": float(np.mean(ctx)) if ctx else 0.0,
        "ctx_weighted": float(np.dot(verified, ctx)) if ctx else 0.0,
        "first_sent_s": np.nan,
        "passes": pass_text(ubatch_sizes([k.slot for k, _ in dec], verified)),
    }
