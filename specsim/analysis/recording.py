"""``record_trace``: record a real trace from a notebook, through the same path as the CLI.

Why a front over ``specsim record`` rather than new code: the command already composes target
loading, drafter choice and the resumable recorder; calling its parser and ``run`` keeps one
code path (and its one-line errors). Needs the ``record`` extra (torch, transformers); nothing
here imports them until the call.
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
    from specsim.cli import build_parser
    from specsim.trace.io import read_trace

    plist = [prompts] if isinstance(prompts, str) else list(prompts)
    argv = ["record", "--target", target, "--drafter", drafter, "--out", str(out)]
    argv += ["--max-new-tokens", str(max_new_tokens), "--temperature", str(temperature)]
    argv += ["--seed", str(seed)]
    if limit is not None:
        argv += ["--limit", str(limit)]
    if block_size is not None:
        argv += ["--block-size", str(block_size)]
    if force:
        argv.append("--force")
    argv += ["--prompts", *plist]
    args = build_parser().parse_args(argv)
    args.func(args)
    return read_trace(out)
