"""Engine-measured step costs in: the tables a serving engine writes, read as a cost profile.

Why: a user running vLLM, SGLang or TensorRT-LLM already has their deployment's measured step
costs, and no model of a GPU predicts a real engine better than the engine's own table. Three
sources are read, each into an ordinary :class:`~specsim.sim.cost.model.CostModel` (so ``--profile``
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

Every reader validates its input (one-line errors naming the file and the fix) by the value rules
of :mod:`specsim.sim.cost.profile_csv` (a step cost, a size or count, a context: the same rules the
profile CSV loader applies to a hand-written ``--profile FILE.csv``) and records where the
numbers came from in the profile's ``source`` metadata.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from specsim.errors import SpecsimError
from specsim.sim.cost import profile_csv as rules
from specsim.sim.cost.model import CostModel

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
    """A CSV (``#`` comment lines skipped) or JSON table as a DataFrame (cells as written: the
    rules of specsim.sim.cost.profile_csv read them)."""
    import pandas as pd

    text = _read_text(path, what)
    s = text.lstrip()
    try:
        if s.startswith(("{", "[")):
            obj = json.loads(s)
            if isinstance(obj, dict) and not any(isinstance(v, list) for v in obj.values()):
                # {"1": 5.1, "2": 5.2, ...}: a flat size -> cost mapping
                return pd.DataFrame({"size": list(obj), "value": list(obj.values())})
            return pd.DataFrame(obj)
        body = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
        return pd.read_csv(io.StringIO(body))
    except (ValueError, TypeError, RecursionError) as exc:
        raise SpecsimError(
            f"{what} {str(path)!r} is not a readable CSV or JSON table: {exc}"
        ) from None


def _pick(df, names: Sequence[str]) -> str | None:  # type: ignore[no-untyped-def]
    cols = {str(c).strip().lower(): c for c in df.columns}
    for n in names:
        if n in cols:
            return cols[n]
    return None


SWAP_HINT = "give the verify table (cost by tokens) first, then the draft table (cost by requests)"


def _size_cost(
    path: str | os.PathLike, what: str, size_names: Sequence[str], other_names: Sequence[str] = ()
) -> tuple[np.ndarray, np.ndarray, int | None]:
    """(sizes, milliseconds, largest ``region``-column graph size or None) of a one-dimensional
    size -> cost table, sorted by size.

    The cost column's name gives its unit (``*_ms`` or ``*_us``); a flat JSON mapping
    ``{"size": cost}`` has none, and is read in microseconds (vLLM's unit). A table whose size
    column is one of ``other_names`` (a request column in the verify table, a token column in
    the draft table) is the other table: refused naming the swap.
    """
    df = _frame(path, what)
    where = f"{what} {str(path)!r}"
    size = _pick(df, (*size_names, "size"))
    if size is None and _pick(df, other_names) is not None:
        raise SpecsimError(f"{where} has a {_pick(df, other_names)} column: {SWAP_HINT}")
    need = f"a size column ({', '.join(size_names)})"
    ms = _costs(df, where, need if size is None else None, bare=True)
    sizes = rules.whole(df[size], f"{where}: sizes (column {size})")
    region, capture = _pick(df, ("region", "mode")), None
    if region is not None:
        graph = df[region].astype(str).str.lower().str.contains("graph").to_numpy(bool)
        capture = int(sizes[graph].max()) if graph.any() else 0
    return (*_sorted(sizes, ms, where), capture)


def _costs(df, where: str, missing: str | None, bare: bool = False) -> np.ndarray:  # type: ignore[no-untyped-def]
    """The cost column in ms (its name gives its unit; ``bare``: a flat mapping's ``value``, in
    us), by the shared step-cost rule; ``missing``: the size column that is not there."""
    cols = [(_pick(df, MS_COLUMNS), 1.0), (_pick(df, US_COLUMNS), 1e-3)]
    cols += [(_pick(df, ("value",)), 1e-3)] if bare else []
    cost = [(c, k) for c, k in cols if c is not None]
    if missing is not None or not cost:
        raise SpecsimError(
            f"{where} needs {missing + ' and ' if missing else ''}a cost column ("
            f"{', '.join(MS_COLUMNS)} in ms or {', '.join(US_COLUMNS)} in us); it has "
            f"{', '.join(map(str, df.columns))}"
        )
    col, scale = cost[0]
    raw = rules.numbers(df[col], f"{where}: column {col}")
    return rules.step_costs(raw * scale, f"{where}: costs (column {col})")


def _sorted(sizes: np.ndarray, ms: np.ndarray, where: str) -> tuple[np.ndarray, np.ndarray]:
    """A table checked by the shared rules, sorted by size: 2 rows or more, each size once."""
    if sizes.size < 2:
        raise SpecsimError(f"{where} needs at least 2 rows")
    order = np.argsort(sizes, kind="stable")
    sizes, ms = sizes[order], ms[order]
    if np.any(np.diff(sizes) == 0):
        twice = sizes[1:][np.diff(sizes) == 0][0]
        raise SpecsimError(f"{where} lists size {twice} twice; keep one row per size")
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
    draft_free: bool = False,
    **scalars: Any,
) -> CostModel:
    """vLLM's adaptive-verification profile: verify cost by token count (``verify``) and draft
    cost by request count (``draft``), each a CSV or JSON table in ms or us.

    As vLLM reads them: both forced monotonic by a running maximum (``monotonic``), the verify
    table a staircase up to the largest CUDA-graph capture size (``capture_max_tokens``; by
    default the largest size of a ``region`` column's ``cudagraph`` rows, else the whole table)
    and continuous past it. The draft cost is per step whatever the draft depth (a parallel
    block drafter runs one forward). Without a draft table drafting would cost nothing: that is
    refused unless ``draft_free`` says so. Tables given in the wrong order (the draft table's
    cost above the verify table's at every size both cover, or a request column where tokens
    belong) are refused naming the swap. ``scalars``: other CostModel fields
    (``max_running``, ``kv_tokens``, ``max_batched_tokens``, ``gpus``, ...).
    """
    if draft is not None and draft_free:
        raise SpecsimError("vLLM adaptive profile: give a draft table or --draft-free, not both")
    if draft is None and not draft_free:
        raise SpecsimError(
            "vLLM adaptive profile: no draft table, so drafting would cost nothing; give the "
            "draft table (cost by requests) after the verify table, or say --draft-free"
        )
    b, ms, capture = _size_cost(verify, "vLLM verify table", TOKEN_COLUMNS, REQUEST_COLUMNS)
    if capture_max_tokens is None:
        capture_max_tokens = capture or 0
    curve: tuple[tuple[int, float], ...] = ()
    if draft is not None:
        r, dms, _ = _size_cost(draft, "vLLM draft table", REQUEST_COLUMNS, TOKEN_COLUMNS)
        both = r[(r >= b[0]) & (r <= b[-1])]
        d_at, v_at = np.interp(both, r, dms), np.interp(both, b, ms)
        if both.size and np.all(d_at > v_at):
            raise SpecsimError(
                f"the draft table {Path(draft).name!r} costs more than the verify table "
                f"{Path(verify).name!r} at every size both cover ({d_at[0]:.4g} against "
                f"{v_at[0]:.4g} ms at {both[0]}): they look swapped; {SWAP_HINT}"
            )
        if monotonic:
            dms = running_max(dms)
        curve = tuple((int(x), float(y)) for x, y in zip(r, dms, strict=True))
    if monotonic:
        ms = running_max(ms)
    meta = {
        "source": f"vLLM adaptive-verification profile: {Path(verify).name}"
        + (f" + {Path(draft).name}" if draft is not None else " (drafting free: --draft-free)"),
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
    where = f"step table {str(path)!r}"
    tok, ctx = _pick(df, TOKEN_COLUMNS), _pick(df, CONTEXT_COLUMNS)
    ms = _costs(df, where, f"a token column ({', '.join(TOKEN_COLUMNS)})" if tok is None else None)
    b = rules.whole(df[tok], f"{where}: token counts (column {tok})")
    meta = {"source": f"measured step table: {Path(path).name}", "import": "table"}
    common = dict(
        name=name or Path(path).stem,
        interpolation=interpolation,
        capture_max_tokens=capture_max_tokens,
        meta=meta,
        **scalars,
    )
    c = None if ctx is None else rules.contexts(df[ctx], f"{where}: contexts (column {ctx})")
    if c is not None and np.unique(c).size == 1:  # one context: a 1-D table measured there
        meta["context_tokens"] = f"{c[0]:g}"
        c = None
    if c is None:
        b, ms = _sorted(b, ms, where)
        return CostModel(batch_tokens=b, step_ms=running_max(ms) if monotonic else ms, **common)
    import pandas as pd

    grid = pd.DataFrame({"c": c, "b": b, "ms": ms})
    if grid.duplicated(subset=["c", "b"]).any():
        raise SpecsimError(f"{where} lists a (context, tokens) pair twice; keep one")
    piv = grid.pivot_table(index="c", columns="b", values="ms")
    if piv.isna().any().any():
        raise SpecsimError(f"{where}: a 2-D table needs every token count at every context")
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


def _points(obj: dict, xkey: str, ykey: str, where: str, to_ms=None, zero_ok: bool = False):  # type: ignore[no-untyped-def]
    """(sizes, ms) of a JSON table's two lists, by the shared rules (``to_ms``: the y values'
    conversion to step milliseconds, e.g. seconds or steps per second)."""
    xs, ys = obj.get(xkey), obj.get(ykey)
    if xs is None or ys is None:
        raise SpecsimError(f"{where} has no {xkey if xs is None else ykey!r} list")
    if not (isinstance(xs, list) and isinstance(ys, list) and len(xs) == len(ys)):
        raise SpecsimError(f"{where}: {xkey} and {ykey} must be number lists of equal length")
    x = rules.whole(xs, f"{where}: {xkey}")
    y = rules.numbers(ys, f"{where}: {ykey}")
    with np.errstate(divide="ignore", over="ignore"):
        ms = y if to_ms is None else to_ms(y)
    return _sorted(x, rules.step_costs(ms, f"{where}: {ykey} (as ms)", zero_ok), where)


def _term_ms(obj: dict, key: str, where: str, scale: float = 1.0) -> float:
    """A table's fixed term (``fixed_overhead_ms``, ``bias_seconds``) in ms; 0 when absent."""
    v = rules.numbers([obj.get(key, 0.0)], f"{where}: {key}") * scale
    return float(rules.step_costs(v, f"{where}: {key} (as ms)", zero_ok=True)[0])


def _fixed_curve(obj: dict, xkey: str, ykey: str, fixed: float, where: str, scale: float = 1.0):  # type: ignore[no-untyped-def]
    """The loop's overhead curve: a fixed term plus an optional per-batch-size table."""
    if xkey not in obj:
        return ((1, fixed), (2, fixed)) if fixed else ()
    r, over = _points(obj, xkey, ykey, where, lambda y: y * scale, zero_ok=True)
    return tuple((int(x), float(y) + fixed) for x, y in zip(r, over, strict=True))


def from_trtllm(path: str | os.PathLike, *, name: str | None = None, **scalars: Any) -> CostModel:
    """TensorRT-LLM's DSpark cost table: ``step(M, bs) = interp(token_counts -> step_time_ms)(M)
    + fixed_overhead_ms + interp(batch_sizes -> batch_overhead_ms)(bs)``, M the verified tokens
    (one bonus per request included). The token table becomes the step table, the fixed and
    per-batch-size terms the loop's overhead curve. Schema v2 (exact per-graph cells) is refused:
    it holds no table between its measured cells."""
    what = "TensorRT-LLM cost table"
    obj = _json_object(path, what)
    where = f"{what} {str(path)!r}"
    if obj.get("schema_version") == 2 or "cost_tables" in obj:
        raise SpecsimError(
            f"{where} is schema v2 (exact per-graph-batch cells, no table between them); give "
            "the interpolating table (token_counts, step_time_ms)"
        )
    b, ms = _points(obj, "token_counts", "step_time_ms", where)
    fixed = _term_ms(obj, "fixed_overhead_ms", where)
    curve = _fixed_curve(obj, "batch_sizes", "batch_overhead_ms", fixed, where)
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
    where = f"{what} {str(path)!r}"
    meta = {"source": f"SGLang DSpark SPS table: {Path(path).name}", "import": "sglang"}
    curve: tuple[tuple[int, float], ...] = ()
    if "sample_steps_per_sec" in obj:
        sps_ms = lambda y: 1000.0 / y  # noqa: E731 - a step costs 1/SPS
        b, ms = _points(obj, "sample_batch_tokens", "sample_steps_per_sec", where, sps_ms)
    elif "theta_seconds" in obj:
        b, ms = _points(obj, "m_probes", "theta_seconds", where, lambda y: y * 1000.0)
        bias = _term_ms(obj, "bias_seconds", where, 1000.0)
        curve = _fixed_curve(obj, "bs_probes", "alpha_seconds", bias, where, 1000.0)
    else:
        raise SpecsimError(
            f"{where} needs sample_batch_tokens/sample_steps_per_sec or the additive "
            "bias_seconds/bs_probes/alpha_seconds/m_probes/theta_seconds"
        )
    return CostModel(
        name=name or Path(path).stem, batch_tokens=b, step_ms=ms, overhead_curve=curve,
        meta=meta, **scalars,
    )  # fmt: skip


def bench_point(path: str | os.PathLike) -> tuple[int, float, str]:
    from specsim.sim.cost.baseline import refuse_speculation

    """(concurrency, median ITL ms, kind) of one bench result file without speculation."""
    obj = _json_object(path, "bench result")
    where = f"bench result {str(path)!r}"
    if "summary" in obj and "config" in obj:  # specsim bench --json
        s, cfg = obj["summary"], obj["config"]
        if not (isinstance(s, dict) and isinstance(cfg, dict)):
            raise SpecsimError(
                f"{where}: 'summary' and 'config' must be JSON objects, as 'specsim bench "
                "--json' writes them; give that file unedited"
            )
        conc, itl, kind = cfg.get("concurrency"), s.get("itl_ms_p50"), "specsim bench"
        refuse_speculation({"num_drafts": s.get("draft_tokens")}, where)
    else:  # vllm bench serve --save-result
        conc, itl, kind = obj.get("max_concurrency"), obj.get("median_itl_ms"), "vllm bench"
        refuse_speculation(obj, where)
    if conc is None or itl is None:
        raise SpecsimError(
            f"{where} has no closed-loop concurrency and median ITL (run the benchmark with "
            "--max-concurrency / --concurrency)"
        )
    c = rules.count(conc, f"{where}: concurrency")
    return c, float(rules.step_costs([itl], f"{where}: median ITL")[0]), kind


def from_bench(paths: Iterable[str | os.PathLike], *, name: str | None = None, **scalars: Any):  # type: ignore[no-untyped-def]
    """Decode steps measured by bench runs without speculation, one run per concurrency C: the
    step at a batch of C tokens takes the run's median inter-token latency.

    What it misses (and says in ``source``): steps that also prefill (a median skips them),
    and sizes between and beyond the concurrencies run (linear between them, the last slope
    beyond, held flat if it falls).
    """
    pts = [bench_point(p) for p in paths]
    if len(pts) < 2:
        raise SpecsimError("bench import needs at least 2 runs at different concurrencies")
    b = np.array([c for c, _, _ in pts], dtype=np.int64)
    ms = np.array([m for _, m, _ in pts], dtype=np.float64)
    b, ms = _sorted(b, ms, "bench import (concurrency as size)")
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
