"""The reference server of an audit (the URL given, or a llama-server started here), and the
check, before either audit starts, that the servers named answer at all.

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
    model = _reference_model(cfg)
    from specsim.serve.llama_server import LlamaServer, ServerSpec

    # one slot per request in flight on either side (T > 0: scoring has its own; greedy's null
    # reads 2 paths)
    scoring = cfg.reference_concurrency if cfg.temperature > 0 else 0
    n_slots = max(cfg.concurrency, scoring, 2 if cfg.temperature == 0 else 1)
    args = (*cfg.reference_args.split(), "-np", str(n_slots))
    with LlamaServer(ServerSpec(model=model, args=args)) as srv:
        yield srv.url


def _reference_model(cfg: Any) -> Path:
    """The GGUF a reference is started from, when no --reference URL is given."""
    if not cfg.reference_model:
        raise SpecsimError(
            "the audit needs a reference: --reference URL (the same model with speculation off) "
            "or --reference-model GGUF (started here)"
        )
    model = Path(cfg.reference_model).expanduser()
    if not model.is_file():
        raise SpecsimError(f"--reference-model {model}: no such file")
    return model


def check_answering(cfg: Any) -> None:
    """Before any audit request: a reference is given, and each server named by URL (--server,
    and --reference when given) answers ``GET /health`` within ``--first-byte-timeout-s`` (30 s;
    --timeout-s when that is shorter), whatever its status. Why: a server that accepts the
    connection but never answers would otherwise hold the audit for the whole --timeout-s (600
    s) per read before any error; this says so in one line naming it, after a stated time."""
    if not cfg.reference:
        _reference_model(cfg)
    limit, flag = cfg.first_byte_timeout_s, "--first-byte-timeout-s"
    if cfg.timeout_s < limit:
        limit, flag = cfg.timeout_s, "--timeout-s"
    for who, url in (("the server", cfg.server), ("the reference", cfg.reference)):
        if url:
            _probe(who, url, limit, flag)


def _probe(who: str, url: str, limit: float, flag: str) -> None:
    import httpx

    try:
        with httpx.Client(timeout=httpx.Timeout(limit)) as client:
            client.get(url.rstrip("/") + "/health")
    except httpx.TimeoutException:
        raise SpecsimError(
            f"{who} at {url} did not answer GET /health within {limit:g} s ({flag}): it "
            "accepts connections but sends nothing; restart it or check the URL"
        ) from None
    except httpx.HTTPError as exc:
        why = f"{type(exc).__name__}: {str(exc)[:120]}".rstrip(": ")
        raise SpecsimError(
            f"{who} at {url} does not answer ({why}); start it or check the URL"
        ) from None
