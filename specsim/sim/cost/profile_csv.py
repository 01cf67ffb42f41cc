"""Profile CSV files: the format a measured or generated cost profile is saved in.

Optional header lines ``# key: value`` hold the scalar costs (``draft_base_ms``,
``draft_per_request_ms``, ``draft_per_token_ms``, ``sched_base_us``, ``sched_us_per_request``,
``max_running``, ``kv_tokens``, ``max_batched_tokens``, and the measured engine terms
``step_overhead_ms``, ``verify_per_request_ms``, ``draft_per_context_us``,
``draft_context_window``, ``prefill_token_ms``, ``interpolation`` (``linear`` or ``step``) and
``capture_max_tokens``: specsim.sim.cost.model); anything else is kept as metadata. Then a table
with columns ``batch_tokens,step_ms`` and optionally ``context_tokens`` (a full grid: every
batch size at every context). docs/simulator.md has the details. Reading
validates everything (one-line errors); writing is atomic and refuses to overwrite.
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
import unicodedata
from pathlib import Path

import numpy as np

from specsim.errors import SpecsimError
from specsim.sim.cost.model import CostModel
from specsim.sim.cost.tables import COST_KEYS, CURVE_KEYS, MAX_PROFILE_BATCH

_INT_KEYS = (
    "max_running",
    "kv_tokens",
    "max_batched_tokens",
    "gpus",
    "draft_context_window",
    "capture_max_tokens",
    "tree_tokens_per_request",
    "passes_by_slot",
)
_FLOAT_KEYS = COST_KEYS  # the cost model's non-negative float terms

# --------------------------------------------------------------------------- value rules
# One rule per kind of number a profile holds, shared by this loader, every importer
# (specsim.sim.cost.profile_import), the exporter and the ``profile`` command's arguments, so a
# table written by hand is checked exactly as an imported one.

MIN_STEP_MS = 1e-3  # 1 us: no engine step (a kernel launch and a sync) is faster
MAX_STEP_MS = 3.6e6  # an hour: any step cost above it is a unit mistake
MAX_CONTEXT = 100_000_000  # context tokens one sequence reads: 100x the longest served today


def numbers(values, what: str) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Plain numbers (a column, a JSON list, one value) as float64. A boolean (JSON ``true`` is
    not 1), a list, or text that is not a number is refused; an empty cell becomes NaN and a
    number past float range inf, for the range rules below to refuse in their own words."""
    arr = values.to_numpy() if hasattr(values, "to_numpy") else values
    if isinstance(arr, np.ndarray) and arr.dtype.kind in "iuf":
        return arr.astype(np.float64).ravel()
    items = list(arr) if isinstance(arr, list | tuple | np.ndarray) else [arr]
    out = np.full(len(items), np.nan)
    for i, v in enumerate(items):
        if isinstance(v, bool | np.bool_ | list | tuple | dict | np.ndarray):
            pass  # refused below: JSON true is not 1, a list is not a number
        elif isinstance(v, str):
            with contextlib.suppress(ValueError):
                out[i] = float(v) if v.strip() else np.nan
                continue
        elif isinstance(v, int | float | np.integer | np.floating):
            try:
                out[i] = float(v)
            except OverflowError:  # an integer past float range
                out[i] = np.inf if v > 0 else -np.inf
            continue
        elif _is_na(v):
            continue
        raise SpecsimError(
            f"{what}: {v!r} is not a number; write plain numbers (no booleans, text or lists)"
        )
    return out


def _is_na(v: object) -> bool:
    import pandas as pd

    return bool(pd.isna(v))


def step_costs(
    values, what: str, zero_ok: bool = False, fix: str = "check the units"
) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Step costs in ms: finite, in [1 us, 1 hour] (``zero_ok``: [0, 1 hour], for overhead
    terms an engine may measure as nothing); ``fix`` ends the one-line refusal."""
    x = numbers(values, what)
    lo = 0.0 if zero_ok else MIN_STEP_MS
    bad = ~((x >= lo) & (x <= MAX_STEP_MS))
    if bad.any():
        raise SpecsimError(
            f"{what} must be milliseconds in [{lo:g}, {MAX_STEP_MS:,.0f}] (a step of "
            f"{'0' if zero_ok else '1 us'} to an hour), not {x[bad][0]:.6g}; {fix}"
        )
    return x


def whole(values, what: str, lo: int = 1, hi: int = MAX_PROFILE_BATCH) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Token counts, table sizes, request counts, concurrencies, GPU counts: whole numbers in
    [``lo``, ``hi``] (``hi`` well inside int64), as int64."""
    x = numbers(values, what)
    bad = ~((x >= lo) & (x <= hi) & (np.round(x) == x))
    if bad.any():
        raise SpecsimError(f"{what}: {x[bad][0]:.6g} is not a whole number in [{lo:,}, {hi:,}]")
    return x.astype(np.int64)


def count(value, what: str, lo: int = 1, hi: int = MAX_PROFILE_BATCH) -> int:  # type: ignore[no-untyped-def]
    """One whole number (a concurrency, a GPU count, a header's integer) by :func:`whole`."""
    return int(whole([value], what, lo, hi)[0])


def contexts(values, what: str) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Context tokens per sequence (a mean may be fractional): finite, in [0, MAX_CONTEXT]."""
    x = numbers(values, what)
    bad = ~((x >= 0) & (x <= MAX_CONTEXT))
    if bad.any():
        raise SpecsimError(
            f"{what}: {x[bad][0]:.6g} is not a non-negative number of context tokens up to "
            f"{MAX_CONTEXT:,}"
        )
    return x


def plain_text(value: str, what: str) -> str:
    """A name or header value: no control character or line break (one would split or end the
    profile CSV's ``# key: value`` line and leave a file no reader can parse)."""
    bad = [c for c in str(value) if unicodedata.category(c) in ("Cc", "Zl", "Zp")]
    if bad:
        raise SpecsimError(
            f"{what} {str(value)!r} holds a control character ({bad[0]!r}); use one without"
        )
    return str(value)


# --------------------------------------------------------------------------- input files

MAX_PROFILE_BYTES = 256 << 20  # a million-row table is ~15 MB; far beyond it is not a profile


def read_text_file(path: str | os.PathLike, what: str, max_bytes: int, missing: str,
                   folder: str) -> str:  # fmt: skip
    """A user's input file as UTF-8 text, or one line saying why not. Shared by every reader of
    a file named on the command line (a profile CSV, a model's config.json).

    Why each check: a folder and a missing file need different fixes (``missing`` / ``folder``
    end the message); a FIFO or a device blocks forever or never ends, so only a regular file is
    opened (and non-blocking, then checked again on the open descriptor, in case the name was
    swapped in between); ``max_bytes`` bounds what is read, so a huge file is refused, not
    loaded."""
    p = Path(path)
    where = f"{what} {str(p)!r}"
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        raise SpecsimError(f"{where} does not exist; {missing}") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the name
        raise SpecsimError(f"{where} cannot be read ({_reason(exc)}); {missing}") from None
    if stat.S_ISDIR(mode):
        raise SpecsimError(f"{where} is a folder, not a file; {folder}")
    _require_regular(mode, where)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as fh:
            _require_regular(os.fstat(fh.fileno()).st_mode, where)
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise SpecsimError(f"{where} cannot be read ({_reason(exc)})") from None
    if len(data) > max_bytes:
        raise SpecsimError(
            f"{where} is over {max_bytes / 2**20:g} MiB, more than such a file ever holds; give "
            "the right file"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecsimError(
            f"{where} is not UTF-8 text ({exc.reason} at byte {exc.start}); give a text file"
        ) from None


def _require_regular(mode: int, where: str) -> None:
    """Refuse a FIFO, socket or device: reading one blocks forever or never ends."""
    if not stat.S_ISREG(mode):
        raise SpecsimError(
            f"{where} is not a regular file (a pipe, socket or device); save it to a file first"
        )


def _reason(exc: Exception) -> str:
    from specsim.outputs import os_reason

    return os_reason(exc) if isinstance(exc, OSError) else str(exc)


# --------------------------------------------------------------------------- CSV


def read_profile_csv(path: str | os.PathLike, name: str | None = None) -> CostModel:
    """Load a profile CSV (``# key: value`` header + ``batch_tokens,step_ms[,context_tokens]``)."""
    p = Path(path)
    folder = _profile_folder_hint(p) if p.is_dir() else ""
    text = read_text_file(p, "profile file", MAX_PROFILE_BYTES, "give a CSV path or a name", folder)
    return parse_profile_csv(text, name or p.stem, source=str(p))


def _profile_folder_hint(folder: Path) -> str:
    """What to pass instead of a folder: vLLM's two tables are imported first; otherwise one of
    the folder's CSV files."""
    names = sorted(f.name for f in folder.glob("*.csv") if f.is_file())
    if {"verify_cost.csv", "draft_cost.csv"} <= set(names):
        return (
            "it holds vLLM's verify_cost.csv and draft_cost.csv: import them first (specsim "
            f"profile import vllm-adaptive {folder / 'verify_cost.csv'} "
            f"{folder / 'draft_cost.csv'} --out my.csv), then pass my.csv"
        )
    if names:
        shown = ", ".join(str(folder / n) for n in names[:3]) + (", ..." if len(names) > 3 else "")
        return f"pass one profile CSV in it ({shown})"
    return "pass a profile CSV file (this folder holds none) or a built-in profile name"


def parse_profile_csv(text: str, name: str, source: str = "") -> CostModel:
    import pandas as pd

    meta: dict[str, str] = {}
    body = []
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("#"):
            key, sep, val = s[1:].partition(":")
            if sep:
                meta[key.strip()] = val.strip()
        elif s:
            body.append(line)
    where = source or name
    try:
        df = pd.read_csv(io.StringIO("\n".join(body)))
    except Exception as exc:  # noqa: BLE001 - any parse failure is the user's to fix
        raise SpecsimError(f"profile {where!r} is not a readable CSV: {exc}") from None
    if not {"batch_tokens", "step_ms"} <= set(df.columns):
        raise SpecsimError(
            f"profile {where!r} needs columns batch_tokens,step_ms (has {', '.join(df.columns)})"
        )
    kwargs: dict = {}
    for key in _INT_KEYS:
        if key in meta:  # the cost model checks each one's own range
            kwargs[key] = count(meta.pop(key), f"profile {where!r}: header {key}", 0, 10**13)
    for key in _FLOAT_KEYS:
        if key in meta:
            try:
                kwargs[key] = float(meta.pop(key))
            except ValueError:
                raise SpecsimError(f"profile {where!r}: header {key} is not a number") from None
    for key in CURVE_KEYS:
        if key in meta:
            kwargs[key] = parse_curve(meta.pop(key), where, key)
    if "interpolation" in meta:
        kwargs["interpolation"] = meta.pop("interpolation").lower()
    meta.setdefault("source", source or "csv")
    b = whole(df["batch_tokens"], f"profile {where!r}: batch_tokens", lo=0)
    steps = step_costs(df["step_ms"], f"profile {where!r}: step_ms")
    if "context_tokens" in df.columns:
        ctx = contexts(df["context_tokens"], f"profile {where!r}: context_tokens")
        grid = pd.DataFrame({"c": ctx, "b": b, "ms": steps})
        if grid.duplicated(subset=["c", "b"]).any():
            raise SpecsimError(
                f"profile {where!r} lists a (context_tokens, batch_tokens) pair twice; keep one"
            )
        piv = grid.pivot_table(index="c", columns="b", values="ms")
        if piv.isna().any().any():
            raise SpecsimError(
                f"profile {where!r}: a 2-D table needs every batch_tokens at every context_tokens"
            )
        return CostModel(
            name=name,
            batch_tokens=piv.columns.to_numpy(np.int64),
            step_ms=piv.to_numpy(np.float64),
            context_tokens=piv.index.to_numpy(np.float64),
            meta=meta,
            **kwargs,
        )
    order = np.argsort(b, kind="stable")
    if np.any(np.diff(b[order]) == 0):
        raise SpecsimError(f"profile {where!r} lists a batch_tokens value twice")
    return CostModel(name=name, batch_tokens=b[order], step_ms=steps[order], meta=meta, **kwargs)


def format_curve(curve: tuple[tuple[int, float], ...]) -> str:
    """``((1, 0.5), (4, 12.0))`` -> ``'1:0.5,4:12'`` (a profile header value)."""
    return ",".join(f"{r}:{m:.6g}" for r, m in curve)


def parse_curve(
    text: str, where: str, key: str = "overhead_curve"
) -> tuple[tuple[int, float], ...]:
    """A header's ``overhead_curve`` or ``draft_curve``: ``R:ms,R:ms,...`` (the cost model
    checks the values)."""
    out = []
    for part in text.split(","):
        r, sep, m = part.strip().partition(":")
        try:
            if not sep or float(r) != int(float(r)):
                raise ValueError
            out.append((int(float(r)), float(m)))
        except (ValueError, OverflowError):
            raise SpecsimError(
                f"profile {where!r}: {key} must read 'requests:ms,...' "
                f"(e.g. '1:0.5,4:12,16:60'), got {text!r}"
            ) from None
    return tuple(out)


def write_profile_csv(model: CostModel, path: str | os.PathLike, force: bool = False) -> Path:
    """Write ``model`` as a profile CSV (atomic; refuses to overwrite without ``force``).

    Nothing is written that :func:`parse_profile_csv` would refuse: every header line is
    checked to be one line, and the text is read back (by the loader's own rules) first."""
    from specsim.outputs import check_out, write_text

    p = check_out(path, force=force, suffixes=(".csv",), flag="profile")
    head = {"name": model.name, **{k: v for k, v in model.meta.items() if k != "name"}}
    for k, v in head.items():
        plain_text(k, "profile header key")
        plain_text(v, f"profile {k}")
    lines = [f"# name: {model.name}"]
    lines += [f"# {k}: {v}" for k, v in model.scalars().items()]
    for key in CURVE_KEYS:
        if getattr(model, key):
            lines.append(f"# {key}: {format_curve(getattr(model, key))}")
    lines += [f"# {k}: {v}" for k, v in head.items() if k != "name"]
    if model.is_2d:
        lines.append("context_tokens,batch_tokens,step_ms")
        for c, row in zip(model.context_tokens, model.step_ms, strict=True):
            lines += [f"{c:g},{b},{ms:.6g}" for b, ms in zip(model.batch_tokens, row, strict=True)]
    else:
        lines.append("batch_tokens,step_ms")
        lines += [f"{b},{ms:.6g}" for b, ms in zip(model.batch_tokens, model.step_ms, strict=True)]
    text = "\n".join(lines) + "\n"
    parse_profile_csv(text, model.name, source=f"{model.name} (as it would be written)")
    return write_text(text, p)
