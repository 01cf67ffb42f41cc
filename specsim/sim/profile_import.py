"""Engine-measured step costs in: the tables a serving engine writes, read as a cost profile.

Why: a user running vLLM, SGLang or TensorRT-LLM already has their deployment's measured step
costs, and no model of a GPU predicts a real engine better than the engine's own table. Three
sources are read, each into an ordinary :class:`~specsim.sim.cost.CostModel` (so ``--profile``
takes the result like any profile CSV):

- ``vllm-adaptive``: vLLM's adaptive-verification startup profile (vLLM PR #47808): a verify
  cost per token count and a draft cost per request count, in microseconds, forced monotonic
  by a running maximum, read as a staircase inside the CUDA-graph capture sizes (a batch pays
  the next captured size) and continuously past them (eager mode). See :func:`from_vllm_adaptive`.
- ``trtllm``: TensorRT-LLM's DSpark confidence cost table (``confidence_cost_table_path``: JSON
  ``token_counts`` with ``step_time_ms``, optional ``fixed_overhead_ms`` and ``batch_sizes`` /
  ``batch_overhead_ms``; tensorrt_llm/_torch/speculative/dspark_planner.py), its step model
  ``interp(tokens) + fixed + interp(batch size)`` kept term for term (:func:`from_trtllm`).
- ``sglang``: SGLang's DSpark SPS table (``--speculative-dspark-sps-table-path``: steps per second
  by ``sample_batch_tokens``, or the additive ``bias/alpha(bs)/theta(tokens)`` form in seconds;
  python/sglang/srt/speculative/dspark_components/dspark_sps_table.py) (:func:`from_sglang`).
- ``table``: a plain measured step table, ``tokens[,context] -> ms`` (or microseconds), with the
  column names engines and benchmark scripts use (:func:`from_table`).
- ``bench``: ``vllm bench serve --save-result`` JSON files or ``specsim bench --json`` output of
  runs WITHOUT speculation, one per concurrency: a decode step then holds one token per running
  request, and its median inter-token latency is the step time at that token batch
  (:func:`from_bench`). A run with speculation is refused (its steps' token counts are unknown).

Every reader validates its input (one-line errors naming the file and the fix) and records where
the numbers came from in the profile's ``source`` metadata.
"""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from specsim.errors import SpecsimError
from specsim.sim.cost import CostModel

IMPORT_FORMATS = ("vllm-adaptive", "trtllm", "sglang", "table", "bench")

# column names seen in engines' and benchmark scripts' step tables, by what they hold
TOKEN_COLUMNS = ("batch_tokens", "tokens", "num_tokens", "num_batched_tokens", "token_count")
REQUEST_COLUMNS = ("requests", "num_reqs", "num_requests", "batch_size", "reqs")
CONTEXT_COLUMNS = ("context_tokens", "context", "context_len", "seq_len", "kv_len")
MS_COLUMNS = ("step_ms", "table_ms", "ms", "latency_ms", "time_ms", "cost_ms")
US_COLUMNS = ("step_us", "us", "latency_us", "time_us", "cost_us")


def _read_text(path: str | os.PathLike, what: str) -> str:
    p = Path(path)
    if not p.is_file():
        raise SpecsimError(f"{what} {str(p)!r} is not a file; give the path of the table")
    try:
        return p.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError) as exc:
        raise SpecsimError(f"{what} {str(p)!r} is not a readable text file ({exc})") from None


def _frame(path: str | os.PathLike, what: str):  # type: ignore[no-untyped-def]
    """A CSV (``#`` comment lines skipped) or JSON table as a DataFrame."""
    import pandas as pd

    text = _read_text(path, what)
    s = text.lstrip()
    try:
        if s.startswith(("{", "[")):
            obj = json.loads(s)
            if isinstance(obj, dict) and not any(isinstance(v, list) for v in obj.values()):
                # {"1": 5.1, "2": 5.2, ...}: a flat size -> cost mapping
                return pd.DataFrame({"size": [float(k) for k in obj], "value": list(obj.values())})
            return pd.DataFrame(obj)
        body = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
        return pd.read_csv(io.StringIO(body))
    except (ValueError, TypeError) as exc:
        raise SpecsimError(
            f"{what} {str(path)!r} is not a readable CSV or JSON table: {exc}"
        ) from None


def _pick(df, names: Sequence[str]) -> str | None:  # type: ignore[no-untyped-def]
    cols = {str(c).strip().lower(): c for c in df.columns}
    for n in names:
        if n in cols:
            return cols[n]
    return None


def _size_cost(
    path: str | os.PathLike, what: str, size_names: Sequence[str], bare_unit: str = "us"
) -> tuple[np.ndarray, np.ndarray]:
    """(sizes, milliseconds) of a one-dimensional size -> cost table, sorted by size.

    The cost column's name gives its unit (``*_ms`` or ``*_us``); a flat JSON mapping
    ``{"size": cost}`` has none, and is read in ``bare_unit``.
    """
    df = _frame(path, what)
    size = _pick(df, (*size_names, "size"))
    ms_col, us_col = _pick(df, MS_COLUMNS), _pick(df, US_COLUMNS)
    bare = _pick(df, ("value",))
    if size is None or (ms_col is None and us_col is None and bare is None):
        raise SpecsimError(
            f"{what} {str(path)!r} needs a size column ({', '.join(size_names)}) and a cost "
            f"column ({', '.join(MS_COLUMNS)} in ms or {', '.join(US_COLUMNS)} in us); it has "
            f"{', '.join(map(str, df.columns))}"
        )
    sizes = _numbers(df[size], path, what, str(size))
    if ms_col is not None:
        ms = _numbers(df[ms_col], path, what, str(ms_col))
    elif us_col is not None:
        ms = _numbers(df[us_col], path, what, str(us_col)) / 1000.0
    else:
        ms = _numbers(df[bare], path, what, "value") / (1000.0 if bare_unit == "us" else 1.0)
    return _sorted_checked(sizes, ms, path, what)


def _numbers(col, path, what: str, name: str) -> np.ndarray:  # type: ignore[no-untyped-def]
    import pandas as pd

    x = pd.to_numeric(col, errors="coerce").to_numpy(np.float64)
    if not np.all(np.isfinite(x)):
        raise SpecsimError(f"{what} {str(path)!r}: column {name} has empty or non-numeric cells")
    return x


def _sorted_checked(
    sizes: np.ndarray, ms: np.ndarray, path: Any, what: str, zero_ok: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    if sizes.size < 2:
        raise SpecsimError(f"{what} {str(path)!r} needs at least 2 rows")
    if np.any(sizes != np.round(sizes)) or np.any(sizes < 1):
        raise SpecsimError(f"{what} {str(path)!r}: sizes must be whole numbers >= 1")
    order = np.argsort(sizes, kind="stable")
    sizes, ms = sizes[order].astype(np.int64), ms[order]
    if np.any(np.diff(sizes) == 0):
        raise SpecsimError(f"{what} {str(path)!r} lists a size twice; keep one row per size")
    if np.any(ms < 0) or (not zero_ok and np.any(ms == 0)):
        raise SpecsimError(f"{what} {str(path)!r}: costs must be positive (check the units)")
    return sizes, ms


def running_max(ms: np.ndarray) -> np.ndarray:
    """vLLM's monotonic table: a bigger batch never costs less than a smaller one."""
    return np.maximum.accumulate(np.asarray(ms, dtype=np.float64))


def from_vllm_adaptive(
    verify: str | os.PathLike,
    draft: str | os.PathLike | None = None,
    *,
    name: str | None = None,
    capture_max_tokens: int | None = None,
    monotonic: bool = True,
    **scalars: Any,
) -> CostModel:
    """vLLM's adaptive-verification profile: verify cost by token count (``verify``) and draft
    cost by request count (``draft``), each a CSV or JSON table in ms or us.

    As vLLM reads them: both forced monotonic by a running maximum (``monotonic``), the verify
    table a staircase up to the largest CUDA-graph capture size (``capture_max_tokens``; by
    default the largest size of a ``region`` column's ``cudagraph`` rows, else the whole table)
    and continuous past it. The draft cost is per step whatever the draft depth (a parallel
    block drafter runs one forward). ``scalars``: other CostModel fields (``max_running``,
    ``kv_tokens``, ``max_batched_tokens``, ``gpus``, ...).
    """
    b, ms = _size_cost(verify, "vLLM verify table", TOKEN_COLUMNS)
    if capture_max_tokens is None:
        df = _frame(verify, "vLLM verify table")
        region = _pick(df, ("region", "mode"))
        if region is not None:
            graph = df[df[region].astype(str).str.lower().str.contains("graph")]
            size = _pick(df, (*TOKEN_COLUMNS, "size"))
            capture_max_tokens = int(graph[size].max()) if len(graph) else 0
        else:
            capture_max_tokens = 0
    curve: tuple[tuple[int, float], ...] = ()
    if draft is not None:
        r, dms = _size_cost(draft, "vLLM draft table", REQUEST_COLUMNS)
        if monotonic:
            dms = running_max(dms)
        curve = tuple((int(x), float(y)) for x, y in zip(r, dms, strict=True))
    if monotonic:
        ms = running_max(ms)
    meta = {
        "source": f"vLLM adaptive-verification profile: {Path(verify).name}"
        + (f" + {Path(draft).name}" if draft is not None else ""),
        "import": "vllm-adaptive" + (" (running max)" if monotonic else ""),
    }
    return CostModel(
        name=name or Path(verify).stem,
        batch_tokens=b,
        step_ms=ms,
        draft_curve=curve,
        interpolation="step",
        capture_max_tokens=int(capture_max_tokens),
        meta=meta,
        **scalars,
    )


def from_table(
    path: str | os.PathLike,
    *,
    name: str | None = None,
    interpolation: str = "linear",
    capture_max_tokens: int = 0,
    monotonic: bool = False,
    **scalars: Any,
) -> CostModel:
    """A measured step table: ``tokens -> ms`` or ``tokens x context -> ms`` (a full grid).

    Column names as engines and scripts write them (``batch_tokens``/``tokens``/
    ``num_tokens``, ``context_tokens``/``context``/``seq_len``, ``step_ms``/``ms``/
    ``latency_ms`` or ``step_us``/``us``); a specsim profile CSV's ``# key: value`` header lines
    are skipped here (read those files with ``--profile FILE`` directly).
    """
    df = _frame(path, "step table")
    tok = _pick(df, TOKEN_COLUMNS)
    ctx = _pick(df, CONTEXT_COLUMNS)
    ms_col, us_col = _pick(df, MS_COLUMNS), _pick(df, US_COLUMNS)
    if tok is None or (ms_col is None and us_col is None):
        raise SpecsimError(
            f"step table {str(path)!r} needs a token column ({', '.join(TOKEN_COLUMNS)}) and a "
            f"time column ({', '.join(MS_COLUMNS)} in ms or {', '.join(US_COLUMNS)} in us); it "
            f"has {', '.join(map(str, df.columns))}"
        )
    b = _numbers(df[tok], path, "step table", str(tok))
    ms = (
        _numbers(df[ms_col], path, "step table", str(ms_col))
        if ms_col is not None
        else _numbers(df[us_col], path, "step table", str(us_col)) / 1000.0
    )
    meta = {"source": f"measured step table: {Path(path).name}", "import": "table"}
    common = dict(
        name=name or Path(path).stem,
        interpolation=interpolation,
        capture_max_tokens=capture_max_tokens,
        meta=meta,
        **scalars,
    )
    c = None if ctx is None else _numbers(df[ctx], path, "step table", str(ctx))
    if c is not None and np.unique(c).size == 1:  # one context: a 1-D table measured there
        meta["context_tokens"] = f"{c[0]:g}"
        c = None
    if c is None:
        b, ms = _sorted_checked(b, ms, path, "step table")
        return CostModel(batch_tokens=b, step_ms=running_max(ms) if monotonic else ms, **common)
    import pandas as pd

    grid = pd.DataFrame({"c": c, "b": b, "ms": ms})
    if grid.duplicated(subset=["c", "b"]).any():
        raise SpecsimError(f"step table {str(path)!r} lists a (context, tokens) pair twice")
    piv = grid.pivot_table(index="c", columns="b", values="ms")
    if piv.isna().any().any():
        raise SpecsimError(
            f"step table {str(path)!r}: a 2-D table needs every token count at every context"
        )
    table = piv.to_numpy(np.float64)
    if monotonic:
        table = np.maximum.accumulate(table, axis=1)
    return CostModel(
        batch_tokens=piv.columns.to_numpy(np.int64),
        step_ms=table,
        context_tokens=piv.index.to_numpy(np.float64),
        **common,
    )


def _json_object(path: str | os.PathLike, what: str) -> dict:
    try:
        obj = json.loads(_read_text(path, what))
    except json.JSONDecodeError as exc:
        raise SpecsimError(f"{what} {str(path)!r} is not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise SpecsimError(f"{what} {str(path)!r} is not a JSON object")
    return obj


def _points(obj: dict, xkey: str, ykey: str, path: Any, what: str, scale: float = 1.0,
            zero_ok: bool = False):  # type: ignore[no-untyped-def]  # fmt: skip
    try:
        x = np.asarray(obj[xkey], dtype=np.float64)
        y = np.asarray(obj[ykey], dtype=np.float64) * scale
    except KeyError as exc:
        raise SpecsimError(f"{what} {str(path)!r} has no {exc.args[0]!r} list") from None
    except (TypeError, ValueError):
        raise SpecsimError(
            f"{what} {str(path)!r}: {xkey} and {ykey} must be number lists"
        ) from None
    if x.shape != y.shape or x.ndim != 1 or not np.all(np.isfinite(y)):
        raise SpecsimError(f"{what} {str(path)!r}: {xkey} and {ykey} must be equal-length lists")
    return _sorted_checked(x, y, path, what, zero_ok)


def from_trtllm(path: str | os.PathLike, *, name: str | None = None, **scalars: Any) -> CostModel:
    """TensorRT-LLM's DSpark cost table: ``step(M, bs) = interp(token_counts -> step_time_ms)(M)
    + fixed_overhead_ms + interp(batch_sizes -> batch_overhead_ms)(bs)``, M the verified tokens
    (one bonus per request included). The token table becomes the step table, the fixed and
    per-batch-size terms the loop's overhead curve. Schema v2 (exact per-graph cells) is refused:
    it holds no table between its measured cells."""
    what = "TensorRT-LLM cost table"
    obj = _json_object(path, what)
    if obj.get("schema_version") == 2 or "cost_tables" in obj:
        raise SpecsimError(
            f"{what} {str(path)!r} is schema v2 (exact per-graph-batch cells, no table between "
            "them); give the interpolating table (token_counts, step_time_ms)"
        )
    b, ms = _points(obj, "token_counts", "step_time_ms", path, what)
    try:
        fixed = float(obj.get("fixed_overhead_ms", 0.0))
    except (TypeError, ValueError):
        fixed = float("nan")
    if not (math.isfinite(fixed) and fixed >= 0):
        raise SpecsimError(f"{what} {str(path)!r}: fixed_overhead_ms must be a number >= 0")
    curve: tuple[tuple[int, float], ...] = ()
    if "batch_sizes" in obj:
        r, over = _points(obj, "batch_sizes", "batch_overhead_ms", path, what, zero_ok=True)
        curve = tuple((int(x), float(y) + fixed) for x, y in zip(r, over, strict=True))
    elif fixed:
        curve = ((1, fixed), (2, fixed))
    meta = {"source": f"TensorRT-LLM DSpark cost table: {Path(path).name}", "import": "trtllm"}
    return CostModel(
        name=name or Path(path).stem,
        batch_tokens=b,
        step_ms=ms,
        overhead_curve=curve,
        meta=meta,
        **scalars,
    )


def from_sglang(path: str | os.PathLike, *, name: str | None = None, **scalars: Any) -> CostModel:
    """SGLang's DSpark SPS table: ``sample_batch_tokens`` -> ``sample_steps_per_sec`` (a step
    costs 1/SPS), or the additive form ``bias_seconds + interp(bs_probes -> alpha_seconds)(bs)
    + interp(m_probes -> theta_seconds)(tokens)``, whose bias and batch-size terms become the
    loop's overhead curve."""
    what = "SGLang SPS table"
    obj = _json_object(path, what)
    meta = {"source": f"SGLang DSpark SPS table: {Path(path).name}", "import": "sglang"}
    if "sample_steps_per_sec" in obj:
        b, sps = _points(obj, "sample_batch_tokens", "sample_steps_per_sec", path, what)
        return CostModel(
            name=name or Path(path).stem, batch_tokens=b, step_ms=1000.0 / sps, meta=meta,
            **scalars,
        )  # fmt: skip
    if "theta_seconds" not in obj:
        raise SpecsimError(
            f"{what} {str(path)!r} needs sample_batch_tokens/sample_steps_per_sec or the additive "
            "bias_seconds/bs_probes/alpha_seconds/m_probes/theta_seconds"
        )
    b, ms = _points(obj, "m_probes", "theta_seconds", path, what, 1000.0)
    try:
        bias = float(obj.get("bias_seconds", 0.0)) * 1000.0
    except (TypeError, ValueError):
        bias = float("nan")
    if not (math.isfinite(bias) and bias >= 0):
        raise SpecsimError(f"{what} {str(path)!r}: bias_seconds must be a number >= 0")
    curve: tuple[tuple[int, float], ...] = ((1, bias), (2, bias)) if bias else ()
    if "bs_probes" in obj:
        r, alpha = _points(obj, "bs_probes", "alpha_seconds", path, what, 1000.0, zero_ok=True)
        curve = tuple((int(x), float(y) + bias) for x, y in zip(r, alpha, strict=True))
    return CostModel(
        name=name or Path(path).stem, batch_tokens=b, step_ms=ms, overhead_curve=curve,
        meta=meta, **scalars,
    )  # fmt: skip


def bench_point(path: str | os.PathLike) -> tuple[int, float, str]:
    """(concurrency, median ITL ms, kind) of one bench result file without speculation."""
    obj = _json_object(path, "bench result")
    if "summary" in obj and "config" in obj:  # specsim bench --json
        s, cfg = obj["summary"], obj["config"]
        conc, itl, kind = cfg.get("concurrency"), s.get("itl_ms_p50"), "specsim bench"
        spec = s.get("draft_tokens", 0)
    else:  # vllm bench serve --save-result
        conc, itl, kind = obj.get("max_concurrency"), obj.get("median_itl_ms"), "vllm bench"
        spec = obj.get("spec_decode_num_drafts") or obj.get("num_drafts") or 0
    if spec:
        raise SpecsimError(
            f"bench result {str(path)!r} ran with speculation: its steps hold an unknown number "
            "of tokens; import runs without speculation (one per concurrency)"
        )
    try:
        conc_i, itl_f = int(conc), float(itl)
    except (TypeError, ValueError):
        raise SpecsimError(
            f"bench result {str(path)!r} has no closed-loop concurrency and median ITL "
            "(run the benchmark with --max-concurrency / --concurrency)"
        ) from None
    if conc_i < 1 or not (math.isfinite(itl_f) and itl_f > 0):
        raise SpecsimError(f"bench result {str(path)!r}: concurrency {conc} / ITL {itl} unusable")
    return conc_i, itl_f, kind


def from_bench(paths: Iterable[str | os.PathLike], *, name: str | None = None, **scalars: Any):  # type: ignore[no-untyped-def]
    """Decode steps measured by bench runs without speculation, one run per concurrency C: the
    step at a batch of C tokens takes the run's median inter-token latency.

    What it misses (and says in ``source``): steps that also prefill (a median skips them),
    and sizes between and beyond the concurrencies run (linear between them, the last two
    points' slope beyond).
    """
    pts = [bench_point(p) for p in paths]
    if len(pts) < 2:
        raise SpecsimError("bench import needs at least 2 runs at different concurrencies")
    b = np.array([c for c, _, _ in pts], dtype=np.float64)
    ms = np.array([m for _, m, _ in pts], dtype=np.float64)
    b, ms = _sorted_checked(b, ms, "the bench runs", "bench import")
    kinds = sorted({k for _, _, k in pts})
    meta = {
        "source": f"{' + '.join(kinds)}: median ITL of {len(pts)} runs without speculation "
        f"at concurrency {', '.join(str(int(x)) for x in b)}",
        "import": "bench",
    }
    return CostModel(name=name or "bench", batch_tokens=b, step_ms=ms, meta=meta, **scalars)


__all__ = [
    "IMPORT_FORMATS",
    "bench_point",
    "from_bench",
    "from_sglang",
    "from_table",
    "from_trtllm",
    "from_vllm_adaptive",
    "running_max",
]
