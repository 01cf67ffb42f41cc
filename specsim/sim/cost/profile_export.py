"""specsim's profiles out, in the forms engines read: vLLM's two flat tables, TensorRT-LLM's
DSpark cost table, SGLang's DSpark SPS table, a plain step table.

Why: a profile built from public facts (``v4-pro-16xh20``) or measured here is only useful to
an operator if their engine, or the next tool, can read it; and a round trip (export, import,
replay) is the test that import and export mean the same thing by every number.

What an engine measures is a whole step at some context with some tokens per request; a built
profile keeps parts of that apart (the KV read per cached token, the loop's
per-request overhead). :func:`engine_step_ms` adds them back the way the simulator charges them,
at a stated context and tokens per request, so the exported table is the step the simulator
would time.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np

from specsim.errors import SpecsimError
from specsim.sim.cost import profile_csv as rules
from specsim.sim.cost.model import CostModel
from specsim.sim.cost.tables import MAX_PROFILE_BATCH

EXPORT_FORMATS = ("vllm-adaptive", "trtllm", "sglang", "table")


def vllm_capture_sizes(max_tokens: int = 1024) -> list[int]:
    """vLLM's default CUDA-graph capture sizes: 1, 2, 4, then 8 to 256 by 8, then by 16."""
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, max_tokens + 1, 16)]
    return [s for s in sizes if s <= max_tokens]


def engine_step_ms(
    model: CostModel, tokens, context_tokens: float = 0.0, tokens_per_request: float = 1.0
) -> np.ndarray:
    """The step a real engine would time at ``tokens`` verified tokens: the table at that
    batch, plus the KV read of ``tokens / tokens_per_request`` sequences of ``context_tokens``
    each, the loop's per-request overhead and the per-verified-token accept cost (the terms the
    simulator adds to the table in a decode step)."""
    t = np.asarray(tokens, dtype=np.int64)
    n_req = np.maximum(t / float(tokens_per_request), 1.0)
    ctx = float(context_tokens) if model.is_2d else None
    ms = np.asarray(model.step_time(t, ctx), dtype=np.float64) * 1000.0
    ms = ms + model.kv_read_s(1.0) * 1000.0 * context_tokens * n_req
    ms = ms + np.asarray(model.overhead_ms(n_req), dtype=np.float64)
    return ms + model.accept_per_token_ms * t


def draft_ms_by_requests(model: CostModel, requests, gamma: int) -> np.ndarray:
    """The drafter's cost per step at R requests drafting a block of ``gamma`` each (ms)."""
    return np.asarray(model.draft_ms(np.asarray(requests), gamma), dtype=np.float64)


def _checked_sizes(sizes, what: str) -> np.ndarray:  # type: ignore[no-untyped-def]
    s = np.unique(rules.whole(list(sizes), f"profile export: {what}"))
    if s.size < 2:
        raise SpecsimError(f"profile export: {what} needs at least 2 different sizes")
    return s


FIX = "lower --context, --tokens or --tokens-per-request, or fix the profile"


def _written(values, what: str, zero_ok: bool = False) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Every number an export writes passes the rule an import reads it by (finite, a step of
    1 us to an hour): an engine never gets NaN, inf or a negative cost from specsim."""
    return rules.step_costs(values, f"profile export: {what}", zero_ok, FIX)


def _checked_step(context_tokens: float, tokens_per_request: float = 1.0) -> None:
    """The step an export times: a context by the shared rule, >= 1 token per request."""
    rules.contexts([context_tokens], "profile export: context tokens (--context)")
    tpr = rules.numbers([tokens_per_request], "profile export: --tokens-per-request")[0]
    if not 1 <= tpr <= MAX_PROFILE_BATCH:
        raise SpecsimError(
            f"profile export: tokens per request (--tokens-per-request) must be in [1, "
            f"{MAX_PROFILE_BATCH:,}] (1 = decode), not {tpr:.6g}"
        )


def to_vllm_adaptive(
    model: CostModel,
    out_dir: str | os.PathLike,
    *,
    gamma: int = 7,
    tokens: list[int] | None = None,
    requests: list[int] | None = None,
    capture_max_tokens: int = 1024,
    context_tokens: float = 0.0,
    tokens_per_request: float = 1.0,
    force: bool = False,
) -> list[Path]:
    """``verify_cost.csv`` (tokens, us, region) and ``draft_cost.csv`` (requests, us) in
    ``out_dir``: vLLM's adaptive-verification tables of ``model``.

    Sizes: the capture sizes up to ``capture_max_tokens`` and powers of two past it up to the
    profile's largest batch (``tokens``), 1..``max_running`` at vLLM's capture steps
    (``requests``). Costs as the engine would time them (:func:`engine_step_ms`), rounded to
    0.1 us; vLLM forces its table monotonic itself when it reads it.
    """
    from specsim.outputs import claim, os_reason, write_text

    out = Path(out_dir)
    if tokens is None:
        eager = [1 << k for k in range(11, 21) if capture_max_tokens < (1 << k) <= model.b_max]
        tokens = [*vllm_capture_sizes(capture_max_tokens), *eager]
    if requests is None:
        requests = vllm_capture_sizes(min(model.max_running, 1024))
    t = _checked_sizes(tokens, "verify sizes")
    r = _checked_sizes(requests, "draft sizes")
    _checked_step(context_tokens, tokens_per_request)
    v_us = (
        _written(engine_step_ms(model, t, context_tokens, tokens_per_request), "the verify step")
        * 1e3
    )
    d_us = _written(draft_ms_by_requests(model, r, gamma), "the draft step", zero_ok=True) * 1e3
    region = np.where(t <= capture_max_tokens, "cudagraph", "eager")
    header = f"# exported by specsim from profile {model.name} ({model.meta.get('source', '')})\n"
    files = {
        "verify_cost.csv": "tokens,us,region\n"
        + "".join(f"{a},{b:.1f},{c}\n" for a, b, c in zip(t, v_us, region, strict=True)),
        "draft_cost.csv": "requests,us\n"
        + "".join(f"{a},{b:.1f}\n" for a, b in zip(r, d_us, strict=True)),
    }
    if out.exists() and not out.is_dir():
        raise SpecsimError(f"profile export: {str(out)!r} is a file; give a folder to write into")
    made = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecsimError(
            f"--out: cannot create folder {str(out)!r} ({os_reason(exc)}); choose another"
        ) from None
    try:
        with contextlib.ExitStack() as stack:  # both files claimed before either is written
            claimed = [
                (stack.enter_context(claim(out / n, force=force, suffixes=(".csv",))), b)
                for n, b in files.items()
            ]
            return [write_text(header + body, p) for p, body in claimed]
    except BaseException:
        if made:  # a refused export leaves no empty folder behind
            with contextlib.suppress(OSError):
                out.rmdir()
        raise


def _split_terms(model: CostModel, tokens: np.ndarray, requests: np.ndarray, context: float):
    """(token-indexed ms, request-indexed ms): the step split as TensorRT-LLM and SGLang model it
    (``f(tokens) + g(batch size)``): the table and the accept cost go with the tokens, the
    loop's per-request overhead and the KV every sequence reads with the batch size."""
    _checked_step(context)
    ctx = float(context) if model.is_2d else None
    tok_ms = np.asarray(model.step_time(tokens, ctx), dtype=np.float64) * 1000.0
    tok_ms = tok_ms + model.accept_per_token_ms * tokens
    req_ms = np.asarray(model.overhead_ms(requests), dtype=np.float64)
    req_ms = req_ms + model.kv_read_s(1.0) * 1000.0 * context * requests
    return _written(tok_ms, "token cost"), _written(req_ms, "batch-size cost", zero_ok=True)


def _default_sizes(model: CostModel, tokens, requests):  # type: ignore[no-untyped-def]
    if tokens is None:
        tokens = [
            *vllm_capture_sizes(1024),
            *(1 << k for k in range(11, 21) if (1 << k) <= model.b_max),
        ]
    if requests is None:
        requests = vllm_capture_sizes(min(model.max_running, 1024))
    return _checked_sizes(tokens, "token sizes"), _checked_sizes(requests, "request sizes")


def to_trtllm(
    model: CostModel,
    path: str | os.PathLike,
    *,
    tokens: list[int] | None = None,
    requests: list[int] | None = None,
    context_tokens: float = 0.0,
    force: bool = False,
) -> Path:
    """TensorRT-LLM's DSpark cost table (``confidence_cost_table_path``), the interpolating
    schema its planner reads (tensorrt_llm/_torch/speculative/dspark_planner.py):
    ``token_counts`` (verified tokens, one bonus per request included) -> ``step_time_ms``,
    ``fixed_overhead_ms``, ``batch_sizes`` -> ``batch_overhead_ms``; milliseconds."""
    import json

    from specsim.outputs import claim, write_text

    t, r = _default_sizes(model, tokens, requests)
    tok_ms, req_ms = _split_terms(model, t, r, context_tokens)
    obj = {
        "token_counts": [int(x) for x in t],
        "step_time_ms": [round(float(x), 6) for x in tok_ms],
        "fixed_overhead_ms": 0.0,
        "batch_sizes": [int(x) for x in r],
        "batch_overhead_ms": [round(float(x), 6) for x in req_ms],
        "source": f"specsim profile {model.name} ({model.meta.get('source', '')}), context "
        f"{context_tokens:g} tokens",
    }
    with claim(path, force=force, suffixes=(".json",)) as p:
        return write_text(json.dumps(obj, indent=1) + "\n", p)


def to_sglang(
    model: CostModel,
    path: str | os.PathLike,
    *,
    tokens: list[int] | None = None,
    requests: list[int] | None = None,
    context_tokens: float = 0.0,
    force: bool = False,
) -> Path:
    """SGLang's DSpark SPS table in its additive form (``--speculative-dspark-sps-table-path``,
    python/sglang/srt/speculative/dspark_components/dspark_sps_table.py): ``bias_seconds +
    interp(bs_probes -> alpha_seconds)(bs) + interp(m_probes -> theta_seconds)(tokens)``."""
    import json

    from specsim.outputs import claim, write_text

    t, r = _default_sizes(model, tokens, requests)
    tok_ms, req_ms = _split_terms(model, t, r, context_tokens)
    obj = {
        "bias_seconds": 0.0,
        "bs_probes": [int(x) for x in r],
        "alpha_seconds": [float(x) / 1000.0 for x in req_ms],
        "m_probes": [int(x) for x in t],
        "theta_seconds": [float(x) / 1000.0 for x in tok_ms],
    }
    with claim(path, force=force, suffixes=(".json",)) as p:
        return write_text(json.dumps(obj, indent=1) + "\n", p)


def to_table(
    model: CostModel,
    path: str | os.PathLike,
    *,
    tokens: list[int] | None = None,
    contexts: list[float] | None = None,
    tokens_per_request: float = 1.0,
    force: bool = False,
) -> Path:
    """A plain step table ``batch_tokens,context_tokens,step_ms`` (every size at every context)
    of ``model`` as an engine would time its steps (:func:`engine_step_ms`)."""
    from specsim.outputs import claim, write_text

    if tokens is None:
        tokens = [*vllm_capture_sizes(1024), *(1 << k for k in range(11, 17))]
    top = max(model.b_max, 2)
    t = _checked_sizes([x for x in tokens if x <= top], f"table sizes (up to {top:,} tokens)")
    ctxs = [0.0] if not contexts else sorted({float(c) for c in contexts})
    lines = [f"# exported by specsim from profile {model.name} ({model.meta.get('source', '')})"]
    lines.append("batch_tokens,context_tokens,step_ms")
    for c in ctxs:
        _checked_step(c, tokens_per_request)
        ms = _written(engine_step_ms(model, t, c, tokens_per_request), f"step at context {c:g}")
        lines += [f"{a},{c:g},{b:.6g}" for a, b in zip(t, ms, strict=True)]
    with claim(path, force=force, suffixes=(".csv",)) as p:
        return write_text("\n".join(lines) + "\n", p)


__all__ = [
    "EXPORT_FORMATS",
    "draft_ms_by_requests",
    "engine_step_ms",
    "to_sglang",
    "to_table",
    "to_trtllm",
    "to_vllm_adaptive",
    "vllm_capture_sizes",
]
