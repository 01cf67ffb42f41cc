"""Check a table against trace format v1 and turn it into a :class:`Trace`.

Why one module does both: every check needs the same (request, position) bookkeeping that
building the flat arrays needs, so the table is walked once, vectorised (a million rows in a
fraction of a second, no per-row Python). Every failure is ONE line naming the file, the request
(and position where there is one), the problem and the fix, raised as :class:`TraceError`.
The spec is docs/trace-format.md.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from specsim.errors import TraceError
from specsim.trace.model import OPTIONAL_COLUMNS, REQUIRED_COLUMNS, TRACE_VERSION, Trace

VERSION_KEY = "specsim.trace_version"
SOURCES = ("recorded", "synthetic")
_FIX = "see docs/trace-format.md"
# Parquet metadata keys that pyarrow/pandas add themselves; not trace metadata.
_SYSTEM_META = ("ARROW:schema", "pandas")


# Longest draft block a trace may hold: real drafters verify 1-16 tokens; accept_len is int16.
MAX_BLOCK_SIZE = 1024


def table_meta(table: pa.Table | pa.Schema, path: str | Path = "<table>") -> dict[str, str]:
    """The key-value metadata of a table (or schema) as str -> str, minus pyarrow's/pandas' keys.

    Bytes that are not UTF-8 are refused (naming the file and the key), not replaced: a
    replaced character would pass silently into a report as another target or drafter name."""
    schema = table if isinstance(table, pa.Schema) else table.schema
    meta = {}
    for k, v in (schema.metadata or {}).items():
        key = k.decode("utf-8", "replace")
        if key in _SYSTEM_META:
            continue
        try:
            meta[k.decode("utf-8")] = v.decode("utf-8")
        except UnicodeDecodeError:
            raise TraceError(
                f"{path}: metadata key {key!r} holds bytes that are not UTF-8 text; trace "
                "metadata is text: rewrite the file with specsim.trace.write_trace"
            ) from None
    return meta


def _rid(value: object) -> str:
    """How a request id appears in a message: 17 or 'abc'."""
    return repr(value) if isinstance(value, str) else str(value)


class _Where:
    """Builds the ``file: request R position N:`` prefix of a message."""

    def __init__(self, path: str, ids: np.ndarray, pos: np.ndarray | None) -> None:
        self.path = path
        self.ids = ids
        self.pos = pos

    def row(self, i: int, what: str) -> TraceError:
        where = f"request {_rid(self.ids[i])}"
        if self.pos is not None:
            where += f" position {int(self.pos[i])}"
        return TraceError(f"{self.path}: {where}: {what}")

    def req(self, rid: object, what: str) -> TraceError:
        return TraceError(f"{self.path}: request {_rid(rid)}: {what}")


def _py(value: object) -> object:
    """A numpy scalar as the Python value, so messages read 10, not np.int64(10)."""
    return value.item() if isinstance(value, np.generic) else value


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _column(table: pa.Table, name: str, path: str = "<table>") -> pa.Array:
    """A column as one array (dictionaries decoded). Text is checked here, the one place every
    column is read: a string column holding bytes that are not UTF-8 is refused naming its file
    and row, since Arrow fails on it later with an error that names neither."""
    col = table.column(name).combine_chunks()
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        _check_utf8(path, name, col)
    return col


def _check_utf8(path: str, name: str, col: pa.Array) -> None:
    """Refuse a text column with bytes that are not UTF-8 (the first such row named)."""
    try:
        col.validate(full=True)
        return
    except pa.ArrowException:
        pass
    raw = col.cast(pa.large_binary() if pa.types.is_large_string(col.type) else pa.binary())
    for i, value in enumerate(raw.to_pylist()):
        try:
            (value or b"").decode("utf-8")
        except UnicodeDecodeError:
            raise TraceError(
                f"{path}: row {i}: column {name!r} holds bytes that are not UTF-8 text; text "
                "columns must be UTF-8: rewrite the file with specsim.trace.write_trace"
            ) from None
    raise TraceError(f"{path}: column {name!r} is not valid Arrow text; rewrite the file")


def _check_type(path: str, name: str, typ: pa.DataType) -> None:
    """Refuse a column whose Arrow type cannot hold what the spec says it holds."""
    is_list = pa.types.is_list(typ) or pa.types.is_large_list(typ)
    is_list = is_list or pa.types.is_fixed_size_list(typ)
    want: str | None = None
    if name == "request_id":
        ok = pa.types.is_integer(typ) or pa.types.is_string(typ) or pa.types.is_large_string(typ)
        want = "int64 or string"
    elif name in ("position", "prompt_len", "output_len", "accept_len"):
        ok, want = pa.types.is_integer(typ), "an integer"
    elif name == "draft_tokens":
        ok = is_list and pa.types.is_integer(typ.value_type)
        want = "a list of int32 (token ids)"
    elif name in ("confidence", "accept_prob"):
        ok = is_list and pa.types.is_floating(typ.value_type)
        want = "a list of float32 in [0, 1]"
    elif name == "category":
        ok, want = pa.types.is_string(typ) or pa.types.is_large_string(typ), "a string"
    elif name == "arrival_s":
        ok = pa.types.is_floating(typ) or pa.types.is_integer(typ)
        want = "float64 seconds"
    else:
        return
    if not ok:
        raise TraceError(
            f"{path}: column {name!r} has type {typ} but trace format v1 needs {want}; "
            f"convert the column ({_FIX})"
        )


def _check_meta(path: str, meta: dict[str, str]) -> int | None:
    """Validate the key-value metadata; return the declared block size, if any."""
    version = meta.get(VERSION_KEY)
    if version is None:
        raise TraceError(
            f"{path}: metadata has no {VERSION_KEY!r} key, so this is not a specsim trace; "
            f"write it with specsim.trace.write_trace, which adds {VERSION_KEY}={TRACE_VERSION}"
        )
    if version != TRACE_VERSION:
        raise TraceError(
            f"{path}: unknown trace version {version!r} ({VERSION_KEY}); this specsim reads "
            f"version {TRACE_VERSION!r}: upgrade specsim or re-export the trace"
        )
    source = meta.get("source")
    if source is not None and source not in SOURCES:
        raise TraceError(
            f"{path}: metadata source={source!r} must be one of {', '.join(SOURCES)}; fix the "
            "'source' key"
        )
    temp = meta.get("temperature")
    if temp is not None:
        try:
            t = float(temp)
        except ValueError:
            t = float("nan")
        if not (np.isfinite(t) and t >= 0):
            raise TraceError(
                f"{path}: metadata temperature={temp!r} is not a number >= 0; fix the "
                "'temperature' key"
            )
    block = meta.get("block_size")
    if block is None:
        return None
    try:
        gamma = int(block)
    except ValueError:
        gamma = 0
    if gamma < 1:
        raise TraceError(
            f"{path}: metadata block_size={block!r} is not a positive integer; set it to the "
            "number of draft tokens per block"
        )
    return gamma


def _list_values(where: _Where, name: str, col: pa.Array, gamma: int, n_rows: int) -> np.ndarray:
    """A list column as a (rows, gamma) numpy array, after checking every row has gamma items."""
    if col.null_count:
        raise where.row(_first(np.asarray(col.is_null())), f"{name} is null; every row needs one")
    lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
    bad = lengths != gamma
    if bad.any():
        i = _first(bad)
        raise where.row(
            i,
            f"{name} has {int(lengths[i])} entries but the block size gamma is {gamma}; every "
            f"row's {name} must have exactly gamma entries (or fix metadata block_size)",
        )
    flat = pc.list_flatten(col)
    if flat.null_count:
        i = _first(np.asarray(flat.is_null())) // gamma
        raise where.row(i, f"{name} contains a null entry; fill it")
    return flat.to_numpy(zero_copy_only=False).reshape(n_rows, gamma)


def _check_unit(where: _Where, name: str, values: np.ndarray) -> None:
    """Probabilities must be numbers in [0, 1] (NaN is refused: it poisons every policy)."""
    bad = ~((values >= 0) & (values <= 1))  # True for NaN too
    if bad.any():
        i, k = np.argwhere(bad)[0]
        raise where.row(
            int(i),
            f"{name}[{int(k)}] = {float(values[i, k])!r} is NaN or outside [0, 1]; {name} "
            "entries are probabilities: clip or fix them",
        )


def _int_column(where: _Where, table: pa.Table, name: str) -> np.ndarray:
    col = _column(table, name)
    if col.null_count:
        raise where.row(_first(np.asarray(col.is_null())), f"{name} is null; fill it")
    return col.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)


def validate_table(table: pa.Table, path: str | Path = "<table>") -> Trace:
    """Check ``table`` (columns and key-value metadata) and return the :class:`Trace` it holds.

    Rows come back ordered by request (first-appearance order in the table), then position.
    Raises :class:`TraceError` (one line) on the first problem found.
    """
    path = str(path)
    names = set(table.column_names)
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        raise TraceError(
            f"{path}: missing required column {missing[0]!r}; trace format v1 needs "
            f"{', '.join(REQUIRED_COLUMNS)} ({_FIX})"
        )
    for name in REQUIRED_COLUMNS + OPTIONAL_COLUMNS:
        if name in names:
            typ = table.schema.field(name).type
            if pa.types.is_dictionary(typ):
                typ = typ.value_type
            _check_type(path, name, typ)
    meta = table_meta(table, path)
    declared_gamma = _check_meta(path, meta)

    n_rows = table.num_rows
    rid_col = _column(table, "request_id", path)
    if rid_col.null_count:
        i = _first(np.asarray(rid_col.is_null()))
        raise TraceError(f"{path}: row {i}: request_id is null; every row needs a request id")
    if pa.types.is_integer(rid_col.type):
        try:
            rid_col = rid_col.cast(pa.int64())
        except (pa.ArrowInvalid, OverflowError):  # uint64 ids above 2^63: keep them, as text
            rid_col = rid_col.cast(pa.string())
    else:
        rid_col = rid_col.cast(pa.string())
    raw_ids = rid_col.to_numpy(zero_copy_only=False)
    where = _Where(path, raw_ids, None)
    pos = _int_column(where, table, "position")
    where = _Where(path, raw_ids, pos)

    if n_rows == 0:
        if declared_gamma is None:
            raise TraceError(
                f"{path}: the trace has no rows and no block_size metadata; add rows or set "
                "block_size"
            )
        gamma = declared_gamma
    else:
        lens = pc.list_value_length(_column(table, "confidence"))
        if declared_gamma is not None:
            gamma = declared_gamma
        elif lens.null_count == len(lens):
            raise where.row(0, "confidence is null in every row; each row needs gamma confidences")
        else:
            gamma = int(pc.min(lens).as_py())  # rows of another length are refused below
        if gamma < 1:
            raise where.row(0, "confidence is empty; each row needs gamma >= 1 confidences")
    if gamma > MAX_BLOCK_SIZE:
        raise TraceError(
            f"{path}: the block size gamma = {gamma} is above {MAX_BLOCK_SIZE}; no drafter "
            "verifies blocks that long (accept_len is stored as int16): check the confidence lists"
        )

    conf = _list_values(where, "confidence", _column(table, "confidence"), gamma, n_rows)
    drafts = _list_values(where, "draft_tokens", _column(table, "draft_tokens"), gamma, n_rows)
    accept_prob = None
    if "accept_prob" in names:
        accept_prob = _list_values(
            where, "accept_prob", _column(table, "accept_prob"), gamma, n_rows
        )
    prompt_len = _int_column(where, table, "prompt_len")
    output_len = _int_column(where, table, "output_len")
    accept_len = _int_column(where, table, "accept_len")
    category = arrival = None
    if "category" in names:
        cat_col = _column(table, "category", path)
        if cat_col.null_count:
            raise where.row(_first(np.asarray(cat_col.is_null())), "category is null; fill it")
        category = cat_col.cast(pa.string()).to_numpy(zero_copy_only=False)
    if "arrival_s" in names:
        arr_col = _column(table, "arrival_s")
        if arr_col.null_count:
            raise where.row(_first(np.asarray(arr_col.is_null())), "arrival_s is null; fill it")
        arrival = arr_col.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)

    # Per-row value checks (before reordering, so the row named is the file's row).
    _check_unit(where, "confidence", conf)
    if accept_prob is not None:
        _check_unit(where, "accept_prob", accept_prob)
    bad = (accept_len < 0) | (accept_len > gamma)
    if bad.any():
        i = _first(bad)
        raise where.row(
            i,
            f"accept_len = {int(accept_len[i])} is outside [0, gamma={gamma}]; it counts the "
            "leading drafts the target accepts, so it must be between 0 and the block size",
        )
    bad = (drafts < 0) | (drafts > np.iinfo(np.int32).max)
    if bad.any():
        i = _first(bad.any(axis=1))
        raise where.row(i, "draft_tokens has a negative or too large token id; ids are int32 >= 0")
    bad = (prompt_len < 0) | (prompt_len > np.iinfo(np.int32).max)
    if bad.any():
        i = _first(bad)
        raise where.row(i, f"prompt_len = {int(prompt_len[i])} must be an int32 >= 0")
    if arrival is not None:
        bad = ~(np.isfinite(arrival) & (arrival >= 0))
        if bad.any():
            raise where.row(
                _first(bad), f"arrival_s = {float(arrival[_first(bad)])!r} must be >= 0 s"
            )

    # Requests in first-appearance order, rows sorted by (request, position).
    enc = pc.dictionary_encode(rid_col)
    codes = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    request_ids = enc.dictionary.to_numpy(zero_copy_only=False)
    n_req = len(request_ids)
    if n_rows > 1:
        d_code = np.diff(codes)
        ordered = bool(np.all((d_code > 0) | ((d_code == 0) & (np.diff(pos) >= 0))))
    else:
        ordered = True
    order = None if ordered else np.lexsort((pos, codes))

    def sort(a: np.ndarray | None) -> np.ndarray | None:
        return a if (a is None or order is None) else a[order]

    codes, pos, prompt_len, output_len = sort(codes), sort(pos), sort(prompt_len), sort(output_len)
    raw_ids = sort(raw_ids)
    counts = np.bincount(codes, minlength=n_req).astype(np.int64)
    offsets = np.zeros(n_req + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    where = _Where(path, raw_ids, pos)

    expected = np.arange(n_rows, dtype=np.int64) - offsets[codes]
    bad = pos != expected
    if bad.any():
        i = _first(bad)
        if pos[i] < 0:
            what = f"position {int(pos[i])} is negative"
        elif i > 0 and codes[i - 1] == codes[i] and pos[i - 1] == pos[i]:
            what = f"position {int(pos[i])} appears twice"
        else:
            what = f"position {int(expected[i])} is missing (next present: {int(pos[i])})"
        raise where.req(
            raw_ids[i],
            f"{what}; positions must be contiguous 0..output_len-1, once each: "
            "re-record the request or drop it",
        )

    starts = offsets[:-1]
    for name, values in (
        ("prompt_len", prompt_len),
        ("output_len", output_len),
        ("category", sort(category)),
        ("arrival_s", sort(arrival)),
    ):
        if values is None or n_rows == 0:
            continue
        bad = values != values[starts][codes]
        if bad.any():
            i = _first(bad)
            raise where.req(
                raw_ids[i],
                f"{name} differs between its rows ({_py(values[starts[codes[i]]])!r} at "
                f"position 0, {_py(values[i])!r} at position {int(pos[i])}); it is per request, so "
                "every row of a request must carry the same value",
            )
    req_out = output_len[starts] if n_rows else np.zeros(0, dtype=np.int64)
    bad = req_out != counts
    if bad.any():
        r = _first(bad)
        raise where.req(
            request_ids[r],
            f"output_len is {int(req_out[r])} but the file has {int(counts[r])} "
            f"positions (0..{int(counts[r]) - 1}); output_len must equal the number of rows of "
            "the request",
        )

    return Trace(
        request_ids=request_ids if request_ids.dtype == object else request_ids.astype(np.int64),
        prompt_len=(prompt_len[starts] if n_rows else prompt_len).astype(np.int32),
        output_len=req_out.astype(np.int32),
        offsets=offsets,
        conf=np.ascontiguousarray(sort(conf), dtype=np.float32),
        accept_len=sort(accept_len).astype(np.int16),
        draft_tokens=np.ascontiguousarray(sort(drafts), dtype=np.int32),
        accept_prob=(
            None
            if accept_prob is None
            else np.ascontiguousarray(sort(accept_prob), dtype=np.float32)
        ),
        category=None if category is None else sort(category)[starts].astype(object),
        arrival_s=None if arrival is None else sort(arrival)[starts],
        meta=meta,
        path=path,
    )
