"""Recording as functions: what ``specsim record`` does, callable from a notebook.

The command (``specsim.commands.record``) only parses flags and calls :func:`record_run`, which
returns the recorder's summary for the terminal; a notebook calls :func:`record_trace` (the
public ``specsim.record_trace``), the same run returning the written :class:`Trace`. One code
path, one set of defaults, one set of one-line errors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specsim.errors import SpecsimError


def load_drafter_spec(spec: str, target: Any, block_size: int | None) -> tuple[Any, str]:
    """A drafter from its command-line name: ``dspark`` (v3), ``dspark-v3`` or ``dspark-v2``
    (the drafter of that name shipped for this target, else the one ``train-drafter`` left in
    the cache; ``specsim.record.build.DRAFTER_DIRS``), a checkpoint folder or ``ngram[:N]``."""
    from specsim.record.build import DRAFTER_NAMES, find_drafter_dir
    from specsim.record.dspark import load_drafter

    if spec.startswith("ngram"):
        from specsim.record.ngram import NgramDrafter

        arg = spec.split(":", 1)[1] if ":" in spec else "3"
        n = int(arg) if spec.partition(":")[0] == "ngram" and arg.isascii() and arg.isdigit() else 0
        if not 1 <= n <= 64:
            raise SpecsimError(
                f"drafter {spec!r}: use ngram or ngram:N with N a whole number 1..64 (the "
                "n-gram length prompt lookup matches)"
            )
        return NgramDrafter(n=n, block_size=block_size or 7), f"ngram:{n}"
    named = spec in DRAFTER_NAMES
    path = find_drafter_dir(target, spec) if named else Path(spec).expanduser()
    if named and not path.exists():
        raise SpecsimError(
            f"no trained DSpark drafter for this target at {path}; run 'specsim train-drafter' "
            "first, or pass --drafter ngram"
        )
    drafter = load_drafter(path, device=target.device).bind(target.model.get_input_embeddings())
    if block_size and block_size != drafter.cfg.block_size:
        raise SpecsimError(
            f"the drafter at {path} drafts blocks of {drafter.cfg.block_size}, not {block_size}; "
            "drop --block-size or train one with that block size"
        )
    return drafter, f"dspark:{path.name}"


def _status(text: str) -> None:
    """A line at once (a model load takes minutes on a loaded CPU with no bar to show)."""
    import os
    import sys

    if os.environ.get("SPECSIM_PROGRESS") not in ("0", "off", "no", "false"):
        sys.stderr.write(f"specsim: record: {text}\n")
        sys.stderr.flush()


def record_run(
    prompts: str | list[str],
    out: str | Path,
    *,
    target: str = "smollm2",
    drafter: str = "dspark",
    device: str = "cpu",
    threads: int = 0,
    category: str | None = None,
    max_new_tokens: int = 256,
    temperature: float = 0.0,
    batch_size: int = 16,
    limit: int | None = None,
    block_size: int | None = None,
    seed: int = 0,
    force: bool = False,
    command: str | None = None,
) -> dict[str, Any]:
    """Record ``prompts`` with a real target and drafter into the trace ``out``; return the
    recorder's summary (timings, counts). Checks its arguments before loading anything.
    The arguments are :func:`record_trace`'s."""
    from specsim.outputs import check_out
    from specsim.prompts import load_many
    from specsim.record.models import load_target, set_threads
    from specsim.record.recorder import RecordConfig, record

    if not temperature >= 0 or temperature == float("inf"):
        raise SpecsimError(f"--temperature must be a finite number >= 0, got {temperature}")
    if max_new_tokens < 1:
        raise SpecsimError("--max-new-tokens must be at least 1")
    if batch_size < 1:
        raise SpecsimError("--batch-size must be at least 1")
    if limit is not None and limit < 1:
        raise SpecsimError("--limit must be at least 1")
    out = check_out(out, force=force, suffixes=(".parquet",))
    set_threads(threads)
    plist = [prompts] if isinstance(prompts, str) else list(prompts)
    loaded = load_many(plist, category)
    if limit:
        loaded = loaded[:limit]
    from specsim.record.recorder import check_partial, early_key

    cfg = RecordConfig(
        temperature=temperature, max_new_tokens=max_new_tokens, batch_size=batch_size, seed=seed
    )
    check_partial(out, early_key(loaded, cfg))  # a changed --limit is refused before the load
    _status(f"loading target {target!r} and drafter {drafter!r}")
    tgt = load_target(target, device)
    drf, name = load_drafter_spec(drafter, tgt, block_size)
    _status(f"loaded {tgt.name} and {name}; recording {len(loaded)} prompts into {out}")
    extra = {"command": command or f"specsim.record.api.record_trace({plist!r}, ...)"}
    if getattr(drf.cfg, "sts_temperatures", None):
        extra["confidence"] = "sts"
        extra["sts_temperatures"] = json.dumps(list(drf.cfg.sts_temperatures))
    return record(tgt, drf, name, loaded, out, cfg, force, extra)


def record_trace(prompts: str | list[str], out: str | Path, **options: Any) -> Any:
    """Record ``prompts`` (bundled sets such as ``"gsm8k[:4]"`` or JSONL files) with a real
    target and drafter, write the trace to ``out`` and return it as a :class:`Trace`.

    Options (the ``specsim record`` flags, same defaults): ``target`` (``"smollm2"``:
    SmolLM2-135M-Instruct, a .gguf file or a Hugging Face folder), ``drafter`` (``"dspark"``:
    the drafter shipped for the target; a checkpoint folder; ``"ngram[:N]"``, prompt lookup),
    ``device``, ``threads``, ``category``, ``max_new_tokens`` (256), ``temperature`` (0:
    greedy), ``batch_size``, ``limit``, ``block_size``, ``seed``, ``force``. Needs the
    ``record`` extra (torch, transformers), imported only when called.
    """
    from specsim.trace.io import read_trace

    record_run(prompts, out, **options)
    return read_trace(out)
