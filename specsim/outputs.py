"""Writing what a user asked for: checked before the work, atomic, locked, never lost.

Every file specsim writes for a user goes through here, so the rules hold everywhere:

- ``check_out`` runs BEFORE the work starts: the folder exists and is writable, the name is not
  a directory, its suffix is one the writer knows, and an existing file is only replaced with
  ``--force``. A run of minutes never ends in "could not write".
- ``atomic`` writes to a hidden temporary name beside the target and renames it into place, so a
  partial file never looks complete (a reader sees the old file or the new one).
- ``write_table`` picks the format from the suffix (``.parquet``, ``.csv``, ``.json``: never
  Parquet inside a ``.csv`` name). If the write fails anyway (disk full, folder made read-only
  meanwhile), the table is kept in the system's temporary folder and the one-line error says
  where, so a computed result is not lost.
- ``lock`` takes an exclusive, non-blocking lock beside an output, so a second writer to the same
  ``--out`` is refused in one line instead of silently replacing the first one's table.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from specsim.errors import SpecsimError

TABLE_SUFFIXES = (".parquet", ".csv", ".json")


def _one_of(items: tuple[str, ...]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " or " + items[-1]


def check_out(
    path: str | Path,
    *,
    force: bool = False,
    suffixes: tuple[str, ...] = TABLE_SUFFIXES,
    flag: str = "--out",
) -> Path:
    """Refuse, in one line, an output that could not be written or would overwrite a file."""
    p = Path(path)
    if p.is_dir():
        raise SpecsimError(f"{flag} {str(p)!r} is a directory; give a file name inside it")
    if suffixes and p.suffix.lower() not in suffixes:
        raise SpecsimError(
            f"{flag} {str(p)!r}: the name must end in {_one_of(suffixes)} (the format is "
            "taken from it)"
        )
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        what = "is not a directory" if parent.exists() else "does not exist"
        raise SpecsimError(f"{flag}: folder {str(parent)!r} {what}; create it first")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise SpecsimError(f"{flag}: folder {str(parent)!r} is not writable; choose another")
    if p.exists() and not force:
        raise SpecsimError(f"{flag} {str(p)!r} already exists; pass --force to overwrite it")
    return p


@contextlib.contextmanager
def atomic(path: str | Path) -> Iterator[Path]:
    """``with atomic(out) as tmp: write(tmp)``: renamed into place only if the block succeeds."""
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_table(frame: Any, path: str | Path, meta: dict[bytes, bytes] | None = None) -> Path:
    """Write a DataFrame atomically, format by suffix; on failure keep it and say where."""
    path = Path(path)
    try:
        with atomic(path) as tmp:
            _write_frame_as(frame, tmp, path.suffix, meta)
        return path
    except OSError as exc:
        kept = _keep_elsewhere(frame, path, meta)
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            reason = "no space left on the device"
        where = f"the result was kept in {kept}" if kept else "it could not be kept anywhere"
        raise SpecsimError(f"could not write {str(path)!r} ({reason}); {where}") from None


def _write_frame_as(frame: Any, tmp: Path, suffix: str, meta: dict[bytes, bytes] | None) -> None:
    """Write ``tmp`` in the format that ``suffix`` names (a temp name has its own suffix)."""
    suffix = suffix.lower()
    if suffix == ".csv":
        frame.to_csv(tmp, index=False)
    elif suffix == ".json":
        frame.to_json(tmp, orient="records", indent=1)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pandas(frame, preserve_index=False)
        if meta:
            table = table.replace_schema_metadata({**(table.schema.metadata or {}), **meta})
        pq.write_table(table, tmp)


def _keep_elsewhere(frame: Any, path: Path, meta: dict[bytes, bytes] | None) -> Path | None:
    try:
        fd, name = tempfile.mkstemp(prefix=f"specsim-{path.stem}-", suffix=path.suffix)
        os.close(fd)
        _write_frame_as(frame, Path(name), path.suffix, meta)
        return Path(name)
    except OSError:
        return None


def write_text(text: str, path: str | Path) -> Path:
    """Write a text file atomically (README of a report, a profile CSV, a JSON summary)."""
    path = Path(path)
    with atomic(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


@contextlib.contextmanager
def lock(path: str | Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (a hidden ``.NAME.lock`` beside it) or refuse at once."""
    import fcntl

    path = Path(path)
    lock_path = path.with_name(f".{path.name}.lock")
    try:
        fd = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o644)
    except OSError as exc:
        raise SpecsimError(f"cannot lock {str(path)!r}: {exc.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SpecsimError(
                f"{str(path)!r} is being written by another specsim run; wait for it to "
                "finish or choose another --out"
            ) from None
        yield
    finally:
        os.close(fd)
        with contextlib.suppress(OSError):
            lock_path.unlink()


def jsonable(x: object) -> object:
    """A structure ``json.dumps`` writes as standard JSON: NaN/inf -> None, numpy -> Python."""
    if hasattr(x, "item") and not isinstance(x, (list, tuple, dict)):
        try:
            x = x.item()
        except (ValueError, TypeError):
            pass
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [jsonable(v) for v in x]
    return x
