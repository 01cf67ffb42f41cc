"""llama-server's own record of every step it took: what each slot verified and accepted, where.

Why: a trace of draft-dspark built by running specsim's drafter in torch (fp32) next to the
server's outputs drifts from what the server's quantized drafter drafts (up to 8.9% in
acceptance on the v3 held-out grid). The server can say it itself. Started with
``LLAMA_TRACE=1`` it logs, for every verify, ``accepted A/K draft tokens`` (server-context.cpp,
at info level), and at debug verbosity (``-lv 5``) every step's start: ``generate_draft:
#tokens=N, #draft=K`` when the slot drafted, ``slot decode token, n_tokens = N`` when it did
not. Each line carries the slot, the task and the server's clock (microseconds). Read
together they give every request's steps exactly: the position (N minus the prompt, plus one:
the prefill commits the first token), the drafts verified and the accepted prefix, on the
server's clock, for any drafter, without re-running it.

A task is one request; it is matched to the client's request by its prompt tokens, its
generated tokens and its drafted / accepted totals (the server's ``timings``), in the order
the server launched them (see :func:`match`).

Source: llama.cpp build 11434, ``tools/server/server-context.cpp`` (``handle_last_sampled_token``,
the speculative branch of ``update_slots``, ``print_timings``), ``common/log.cpp`` (the
``MM.SS.mmm.uuu`` stamp of ``--log-timestamps``, on by default for llama-server).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specsim.errors import SpecsimError

ENV = {"LLAMA_TRACE": "1"}  # the server's "accepted A/K" lines
ARGS = ("-lv", "5")  # debug verbosity: every step's start (llama.cpp's LOG_LEVEL_DEBUG)

_STAMP = r"(?P<m>\d+)\.(?P<s>\d{2})\.(?P<ms>\d{3})\.(?P<us>\d{3}) (?P<lvl>\w) "
_SLOT = r"slot +[^:|]+: id +(?P<slot>\d+) \| task (?P<task>-?\d+) \| "
LINE = re.compile(
    _STAMP
    + _SLOT
    + r"(?:"
    + r"generate_draft: id=\d+, #tokens=(?P<dn>\d+), #draft=(?P<dk>\d+)"
    + r"|slot decode token, id=\d+, n_ctx = \d+, n_tokens = (?P<pn>\d+)"
    + r"|accepted +(?P<acc>\d+)/ *(?P<of>\d+) draft tokens(?!,)"  # the info line, once
    + r"|prompt eval time = +[\d.]+ ms / +(?P<prompt>\d+) tokens"
    + r"|\s+eval time = +[\d.]+ ms / +(?P<gen>\d+) tokens"
    + r"|processing task"
    + r")"
)


@dataclass
class Task:
    """One request's life on the server: its steps in order and its totals."""

    task: int
    slot: int
    launched_s: float
    t_s: list[float] = field(default_factory=list)  # each step's start, server clock
    n_tokens: list[int] = field(default_factory=list)  # the slot's tokens at the step
    drafted: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    prompt_n: int = -1  # prompt tokens the server evaluated (the uncached part)
    generated: int = -1
    ended_s: float = float("nan")  # its timings' line: after the step that ended it

    @property
    def totals(self) -> tuple[int, int]:
        return sum(self.drafted), sum(self.accepted)


_ENDED = re.compile(r"\|\s+eval time =")  # a task's timings line (not "prompt eval time")


def settled_text(srv, at: int, requests: int, timeout_s: float = 10.0) -> tuple[str, int]:  # noqa: ANN001
    """The log of ``srv`` (a started LlamaServer) from offset 0 to its last whole line, once
    ``requests`` tasks since offset ``at`` have their timings line in it, and where that text
    ends. The server writes its log from a thread of its own, so a run's last lines can land
    after its last response: read at once, the last tasks have no totals yet (a flaky
    recording). Waits up to ``timeout_s``; the caller's matching then names what is missing."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        text = srv.log_text()
        end = text.rfind("\n") + 1  # whole lines only
        if len(_ENDED.findall(text, at, end)) >= requests or time.monotonic() > deadline:
            return text[:end], end
        time.sleep(0.05)


def parse(text: str) -> list[Task]:
    """Every task of a server log, in launch order (the log must come from a server started
    with :data:`ENV` and :data:`ARGS`; a speculative server without them is refused)."""
    tasks: dict[int, Task] = {}
    pending: dict[int, int] = {}  # slot -> index of its step awaiting an "accepted" line
    saw_verify = saw_step = False
    for m in LINE.finditer(text):
        t = int(m["m"]) * 60 + int(m["s"]) + int(m["ms"]) / 1e3 + int(m["us"]) / 1e6
        slot, tid = int(m["slot"]), int(m["task"])
        if (
            m["dn"] is None
            and m["pn"] is None
            and m["acc"] is None
            and m["prompt"] is None
            and (m["gen"] is None)
        ):
            tasks[tid] = Task(tid, slot, t)  # processing task
            continue
        task = tasks.get(tid)
        if task is None:
            continue  # a line of a task launched before the log's window
        if m["dn"] is not None or m["pn"] is not None:
            saw_step = True
            drafted = int(m["dk"]) if m["dn"] is not None else 0
            task.t_s.append(t)
            task.n_tokens.append(int(m["dn"] if m["dn"] is not None else m["pn"]))
            task.drafted.append(drafted)
            task.accepted.append(0)
            if drafted:
                pending[slot] = len(task.drafted) - 1
        elif m["acc"] is not None:
            saw_verify = True
            i = pending.pop(slot, None)
            if i is None or task.drafted[i] != int(m["of"]):
                raise SpecsimError(
                    f"llama-server log: task {tid} accepted {m['acc']}/{m['of']} with no step "
                    "that drafted as many; was it started with -lv 5 (spec_log.ARGS)?"
                )
            task.accepted[i] = int(m["acc"])
        elif m["prompt"] is not None:
            task.prompt_n = int(m["prompt"])
        else:
            task.generated = int(m["gen"])
            task.ended_s = t
    if saw_verify and not saw_step:
        raise SpecsimError(
            "llama-server log has verifies but no step lines: start it with -lv 5 "
            "(specsim.serve.spec_log.ARGS) to record the server's own steps"
        )
    return sorted(tasks.values(), key=lambda k: (k.launched_s, k.task))


def table(tasks: Sequence[Task]):  # noqa: ANN201 - a DataFrame
    """Every step of ``tasks`` as one tidy table (a row a step: task, slot, the server's clock,
    the slot's tokens, drafted, accepted; the task's prompt and generated tokens)."""
    import pandas as pd

    rows = [
        {"task": t.task, "slot": t.slot, "t_s": ts, "n_tokens": n, "drafted": k, "accepted": a,
         "prompt_n": t.prompt_n, "generated": t.generated}
        for t in tasks
        for ts, n, k, a in zip(t.t_s, t.n_tokens, t.drafted, t.accepted, strict=True)
    ]  # fmt: skip
    return pd.DataFrame(rows)


def keep_table(text: str, raw: Path, dest: Path) -> list[Task]:
    """Parse a step log's ``text`` and keep it as its tidy table (:func:`table`) at ``dest``,
    removing the raw log at ``raw`` (a debug log runs to megabytes): the parsed tasks."""
    tasks = parse(text)
    dest.parent.mkdir(parents=True, exist_ok=True)
    table(tasks).to_parquet(dest)
    raw.unlink(missing_ok=True)
    return tasks


def match(
    tasks: Sequence[Task], prompts: Sequence[int], results: Sequence[tuple[int, int, int]]
) -> list[Task]:
    """The task of each request: ``prompts[i]`` its prompt tokens, ``results[i]`` its (tokens
    generated, drafted, accepted) from the server's timings; requests in the order they were
    sent. Each request takes the earliest-launched unmatched task that agrees on all four
    (the prompt with no cache reuse; one of the totals off names both)."""
    free = [t for t in tasks if t.generated >= 0]
    out = []
    for i, (plen, (gen, dn, da)) in enumerate(zip(prompts, results, strict=True)):
        hit = next(
            (t for t in free if (t.prompt_n, t.generated, *t.totals) == (plen, gen, dn, da)), None
        )
        if hit is None:
            raise SpecsimError(
                f"request {i} (prompt {plen}, {gen} generated, {dn} drafted, {da} accepted) has "
                "no task in the server's log that agrees; were its prompts sent with "
                "cache_prompt false, one run per log?"
            )
        free.remove(hit)
        out.append(hit)
    return out


def positions(task: Task, prompt_len: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """``(drafted, accepted)`` over a request's ``length`` output positions as the server
    walked them (position = the slot's tokens - the prompt + 1; positions the walk skipped
    stay 0: a replay that verifies as the server does never reads them)."""
    drafted = np.zeros(length, dtype=np.int64)
    accepted = np.zeros(length, dtype=np.int64)
    for n_tok, k, a in zip(task.n_tokens, task.drafted, task.accepted, strict=True):
        pos = n_tok - prompt_len + 1
        if not 1 <= pos < length:
            raise SpecsimError(
                f"task {task.task}: a step at {n_tok} tokens is outside its request's output "
                f"(prompt {prompt_len}, {length} tokens)"
            )
        drafted[pos], accepted[pos] = k, a
    return drafted, accepted
