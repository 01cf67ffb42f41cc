"""Read and write trace files (Parquet, trace format v1; docs/trace-format.md).

Why Parquet with list columns: one row per (request, position) keeps the file tidy for pandas
users, and pyarrow flattens the list columns into (rows, gamma) numpy arrays without a Python
loop, so a million-row trace loads in well under two seconds. Writes validate first, refuse to
overwrite without ``force``, and go to a temporary name that is renamed into place only when
complete, so a crash never leaves a file that looks finished.
"""

from __future__ import annotations

import contextlib
import json
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from specsim.errors import SpecsimError, TraceError
from specsim.outputs import atomic, check_out
from specsim.trace.model import TRACE_VERSION, Trace
from specsim.trace.validate import VERSION_KEY, table_meta, validate_table


def shipped_traces() -> dict[str, Path]:
    """The traces installed with specsim, by name (``chat`` -> .../data/traces/chat.parquet).

    Why shipped: a ``pip install`` without the checkout must still run the Quickstart and the
    tour, which name ``traces/chat.parquet``; the repository's ``traces`` folder is a link here.
    """
    folder = Path(str(resources.files("specsim") / "data" / "traces"))
    return {p.stem: p for p in sorted(folder.glob("*.parquet"))}


def resolve_trace(path: str | Path) -> Path:
    """The file a trace argument names: the path itself when it exists, else a shipped trace.

    ``chat``, ``chat.parquet`` and ``traces/chat.parquet`` all name the shipped chat trace when
    no such file exists relative to the working directory, so the README's commands run from any
    folder. Anything else that does not exist is an error naming the shipped traces.
    """
    p = Path(path)
    if p.exists():
        if p.is_dir():
            raise TraceError(f"{p}: is a directory, not a trace file; give a .parquet file")
        return p
    shipped = shipped_traces()
    parts = p.parts
    bare = len(parts) == 1 or (len(parts) == 2 and parts[0] == "traces")
    name = p.name[: -len(".parquet")] if p.name.endswith(".parquet") else p.name
    if bare and name in shipped:
        return shipped[name]
    raise TraceError(
        f"trace file {str(p)!r} does not exist; give a .parquet path or a shipped trace name "
        f"({', '.join(shipped)})"
    )


def _parquet(p: Path, read: Any) -> Any:
    """``read(source)`` of the file at ``p``: pyarrow opens a path by its name in UTF-8, which a
    Linux file name need not be (it fails with UnicodeEncodeError), so such a file is opened
    here and handed over open."""
    with contextlib.ExitStack() as stack:
        try:
            str(p).encode("utf-8")
            source: Any = str(p)
        except UnicodeEncodeError:
            source = stack.enter_context(open(p, "rb"))  # noqa: SIM115 - closed by the stack
        return read(source)


def _read_table(path: str | Path) -> pa.Table:
    p = resolve_trace(path)
    if p.is_dir():
        raise TraceError(f"{p}: is a directory, not a trace file; give a .parquet file")
    try:
        return _parquet(p, pq.read_table)
    except MemoryError:  # ArrowMemoryError is one too: say which limit, not "unreadable"
        size = p.stat().st_size / 2**20
        raise TraceError(
            f"{p}: not enough memory to read this trace ({size:,.0f} MiB on disk, several times "
            "that in memory); raise the memory limit (ulimit -v) or use a machine with more"
        ) from None
    except (pa.ArrowException, OSError) as exc:
        raise TraceError(
            f"{p}: not a readable Parquet file ({type(exc).__name__}: {exc}); write traces "
            "with specsim.trace.write_trace or `specsim record`"
        ) from None


def read_trace(path: str | Path) -> Trace:
    """Read, validate and return the trace in ``path`` (rows by request, then position)."""
    table = _read_table(path)
    try:
        return validate_table(table, path)
    except (UnicodeDecodeError, pa.ArrowInvalid) as exc:
        raise TraceError(
            f"{path}: a column holds values Arrow cannot convert ({type(exc).__name__}: "
            f"{str(exc)[:120]}); text must be UTF-8: rewrite the file with write_trace"
        ) from None
    except MemoryError:
        raise TraceError(
            f"{path}: not enough memory to load this trace; raise the memory limit (ulimit -v) "
            "or use a machine with more"
        ) from None


def validate_file(path: str | Path) -> Trace:
    """Read and check a trace file (``specsim traces validate``): the path ``read_trace`` takes."""
    return read_trace(path)


def load_meta(path: str | Path) -> dict[str, str]:
    """The key-value metadata of a trace file (str -> str), read without loading the rows."""
    p = resolve_trace(path)
    try:
        schema = _parquet(p, pq.read_schema)
    except (pa.ArrowException, OSError) as exc:
        raise TraceError(
            f"{p}: not a readable Parquet file ({type(exc).__name__}: {exc}); check the path"
        ) from None
    return table_meta(schema, p)


def _list_array(values: np.ndarray, typ: pa.DataType) -> pa.ListArray:
    rows, gamma = values.shape
    offsets = np.arange(0, rows * gamma + 1, gamma, dtype=np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values.reshape(-1), type=typ))


def trace_to_table(trace: Trace) -> pa.Table:
    """The canonical Arrow table of a trace (format v1 column types), metadata included."""
    counts = np.diff(trace.offsets)
    pos = np.arange(trace.n_rows, dtype=np.int64) - np.repeat(trace.offsets[:-1], counts)
    if trace.request_ids.dtype == object:
        rid = pa.array(np.repeat(trace.request_ids, counts), type=pa.string())
    else:
        rid = pa.array(np.repeat(trace.request_ids, counts).astype(np.int64), type=pa.int64())
    drafts = trace.draft_tokens
    if drafts is None:
        raise TraceError("trace has no draft_tokens; trace format v1 requires them")
    cols: dict[str, pa.Array] = {
        "request_id": rid,
        "position": pa.array(pos.astype(np.int32), type=pa.int32()),
        "prompt_len": pa.array(np.repeat(trace.prompt_len, counts).astype(np.int32)),
        "output_len": pa.array(np.repeat(trace.output_len, counts).astype(np.int32)),
        "draft_tokens": _list_array(np.asarray(drafts, dtype=np.int32), pa.int32()),
        "confidence": _list_array(np.asarray(trace.conf, dtype=np.float32), pa.float32()),
        "accept_len": pa.array(np.asarray(trace.accept_len).astype(np.int16), type=pa.int16()),
    }
    if trace.category is not None:
        cols["category"] = pa.array(np.repeat(trace.category, counts), type=pa.string())
    if trace.accept_prob is not None:
        cols["accept_prob"] = _list_array(
            np.asarray(trace.accept_prob, dtype=np.float32), pa.float32()
        )
    if trace.arrival_s is not None:
        cols["arrival_s"] = pa.array(
            np.repeat(np.asarray(trace.arrival_s, dtype=np.float64), counts), type=pa.float64()
        )
    table = pa.table(cols)
    return table.replace_schema_metadata({k: str(v) for k, v in trace.meta.items()})


def trace_to_frame(trace: Trace) -> pd.DataFrame:
    """A tidy DataFrame, one row per (request, position), list columns as numpy arrays."""
    return trace_to_table(trace).to_pandas()


def _meta_str(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def write_trace(
    frame_or_trace: pd.DataFrame | pa.Table | Trace,
    path: str | Path,
    meta: dict[str, str] | None = None,
    *,
    force: bool = False,
) -> Path:
    """Validate and write a trace to ``path`` (Parquet, zstd); return the path.

    ``meta`` is added to the key-value metadata (over a Trace's own ``meta``); non-string values
    are stored as JSON. ``specsim.trace_version`` and ``block_size`` are set from the data.
    Refuses to replace an existing file unless ``force``. The file appears only when complete.
    """
    path = check_out(path, force=force, suffixes=(".parquet",), flag="trace")

    if isinstance(frame_or_trace, Trace):
        base = dict(frame_or_trace.meta)
        table = trace_to_table(frame_or_trace)
    elif isinstance(frame_or_trace, pd.DataFrame):
        base = {}
        table = pa.Table.from_pandas(frame_or_trace, preserve_index=False)
    elif isinstance(frame_or_trace, pa.Table):
        base = table_meta(frame_or_trace)
        table = frame_or_trace
    else:
        raise SpecsimError(
            f"cannot write a {type(frame_or_trace).__name__} as a trace; pass a Trace, a pandas "
            "DataFrame or a pyarrow Table"
        )
    merged = {**base, **{str(k): _meta_str(v) for k, v in (meta or {}).items()}}
    merged[VERSION_KEY] = TRACE_VERSION
    if table.num_rows and "confidence" in table.column_names and "block_size" not in merged:
        col = table.column("confidence").combine_chunks()
        if col.null_count == 0 and len(col):
            merged["block_size"] = str(len(col[0]))
    # Validate (as the reader will), then write the canonical form of what was validated.
    trace = validate_table(table.replace_schema_metadata(merged), path)
    canonical = trace_to_table(trace)

    try:
        with atomic(path) as tmp:
            pq.write_table(canonical, tmp, compression="zstd")
    except OSError as exc:
        raise SpecsimError(
            f"could not write {path}: {exc.strerror or exc}; check free space and permissions"
        ) from None
    return path
