"""``record_trace``: record a real trace from a notebook, through the same path as the CLI.

The same function ``specsim record`` calls (``specsim.record.api.record_trace``), so a notebook
and the command share one code path and its one-line errors. Needs the ``record`` extra
(torch, transformers); nothing here imports them until the call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def record_trace(
    prompts: str | list[str],
    out: str | Path,
    *,
    target: str = "smollm2",
    drafter: str = "ngram",
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    limit: int | None = None,
    block_size: int | None = None,
    seed: int = 0,
    force: bool = False,
) -> Any:
    """Record ``prompts`` (bundled sets such as ``"gsm8k[:4]"`` or JSONL files) with a real
    target and drafter, write the trace to ``out`` and return it as a :class:`Trace`.

    ``target``: ``"smollm2"`` (SmolLM2-135M-Instruct, CPU-friendly), a .gguf file or a Hugging
    Face model folder. ``drafter``: ``"ngram[:N]"`` (prompt lookup, no training), ``"dspark"``
    (the trained drafter in the cache) or a DSpark checkpoint folder.
    """
    from specsim.record.api import record_trace as record
    from specsim.trace.io import read_trace

    record(
        prompts,
        out,
        target=target,
        drafter=drafter,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        limit=limit,
        block_size=block_size,
        seed=seed,
        force=force,
    )
    return read_trace(out)
