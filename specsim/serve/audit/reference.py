"""The reference server of an audit: the URL given, or a llama-server started here.

Shared by the T > 0 audit (``law``) and the greedy audit (``greedy``): the reference is the
same model with speculation off, the law every audited token is scored against.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from specsim.errors import SpecsimError


@contextlib.contextmanager
def reference_url(cfg: Any):  # noqa: ANN202
    """The reference URL: the given one, or a llama-server started here (stopped on exit)."""
    if cfg.reference:
        yield cfg.reference
        return
    if not cfg.reference_model:
        raise SpecsimError(
            "the audit needs a reference: --reference URL (the same model with speculation off) "
            "or --reference-model GGUF (started here)"
        )
    from specsim.serve.llama_server import LlamaServer, ServerSpec

    model = Path(cfg.reference_model).expanduser()
    if not model.is_file():
        raise SpecsimError(f"--reference-model {model}: no such file")
    # one slot per request in flight on either side (T > 0: scoring has its own; greedy's null
    # reads 2 paths)
    scoring = cfg.reference_concurrency if cfg.temperature > 0 else 0
    n_slots = max(cfg.concurrency, scoring, 2 if cfg.temperature == 0 else 1)
    args = (*cfg.reference_args.split(), "-np", str(n_slots))
    with LlamaServer(ServerSpec(model=model, args=args)) as srv:
        yield srv.url
