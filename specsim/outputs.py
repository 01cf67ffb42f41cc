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
  ``--out`` is refused in one line instead of silently replacing the first one's table. Only the
  owner removes the lock file, and only while it still holds the lock; a refused writer leaves
  it alone (issue #38: a refused writer once deleted the running one's lock).
- ``claim`` is what a command uses: ``check_out`` and ``lock`` together, held for the whole run.
- Hidden names (temporary files, locks) always fit the file system's name limit, so a legal
  255-byte output name never fails after the work; finished files get the mode the umask asks
  for (0666 & ~umask), not ``mkstemp``'s private 0600.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from specsim.errors import SpecsimError

TABLE_SUFFIXES = (".parquet", ".csv", ".json")
NAME_MAX = 255  # bytes in one path component on Linux, macOS and Windows file systems
PATH_MAX = 4096


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
    _check_length(p, flag)
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


def _check_length(p: Path, flag: str) -> None:
    """Names the file system cannot hold are refused before the work, not after it."""
    name_max, path_max = NAME_MAX, PATH_MAX
    with contextlib.suppress(OSError, ValueError, AttributeError):
        parent = p.parent if str(p.parent) else Path(".")
        name_max = os.pathconf(parent, "PC_NAME_MAX")
        path_max = os.pathconf(parent, "PC_PATH_MAX")
    n = len(os.fsencode(p.name))
    if n > name_max:
        raise SpecsimError(
            f"{flag}: the file name is {n} bytes, more than the file system's {name_max}; "
            "choose a shorter name"
        )
    full = len(os.fsencode(os.path.abspath(p)))
    if full >= path_max:
        raise SpecsimError(
            f"{flag}: the path is {full} bytes, more than the file system's {path_max - 1}; "
            "choose a shorter path"
        )


def hidden_name(path: Path, tag: str, room: int = 0) -> str:
    """``.NAME.TAG`` beside ``path``, shortened (with a hash of the full name, so two long names
    never share it) to fit NAME_MAX with ``room`` bytes to spare (``mkstemp``'s random part)."""
    full = f".{path.name}.{tag}"
    budget = NAME_MAX - room
    if len(os.fsencode(full)) <= budget:
        return full
    digest = hashlib.sha1(os.fsencode(path.name)).hexdigest()[:12]
    keep = budget - len(f".~{digest}.{tag}".encode())
    stem = os.fsencode(path.name)[: max(keep, 0)].decode("utf-8", "ignore")
    return f".{stem}~{digest}.{tag}"


def _umask() -> int:
    """The process umask, read without changing it where Linux allows (/proc), else briefly set."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    old = os.umask(0o022)
    os.umask(old)
    return old


@contextlib.contextmanager
def atomic(path: str | Path) -> Iterator[Path]:
    """``with atomic(out) as tmp: write(tmp)``: renamed into place only if the block succeeds,
    with the mode a plain ``open()`` would have given (0666 & ~umask)."""
    path = Path(path)
    prefix = hidden_name(path, "", room=8 + len(".tmp"))  # mkstemp adds 8 random characters
    fd, name = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=path.parent or ".")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())
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
        where = f"the result was kept in {kept}" if kept else "it could not be kept anywhere"
        raise SpecsimError(f"could not write {str(path)!r} ({os_reason(exc)}); {where}") from None


def os_reason(exc: OSError) -> str:
    """Why a write failed, in words a user can act on."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "no space left on the device"
    if exc.errno == errno.EFBIG:
        return "the file size limit (ulimit -f) was reached"
    if exc.errno == errno.ENAMETOOLONG:
        return "the name is too long for the file system"
    return os.strerror(exc.errno) if exc.errno else str(exc)


@contextlib.contextmanager
def writing(path: str | Path) -> Iterator[Path]:
    """``atomic`` whose OS failures (disk full, ulimit -f, read-only folder) are one line."""
    try:
        with atomic(path) as tmp:
            yield tmp
    except OSError as exc:
        raise SpecsimError(f"could not write {str(path)!r} ({os_reason(exc)})") from None


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
        stem = os.fsencode(path.stem)[:100].decode("utf-8", "ignore")
        fd, name = tempfile.mkstemp(prefix=f"specsim-{stem}-", suffix=path.suffix)
        os.close(fd)
        _write_frame_as(frame, Path(name), path.suffix, meta)
        return Path(name)
    except OSError:
        return None


def write_text(text: str, path: str | Path) -> Path:
    """Write a text file atomically (README of a report, a profile CSV, a JSON summary)."""
    path = Path(path)
    with writing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


@contextlib.contextmanager
def lock(path: str | Path, flag: str = "--out") -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (a hidden ``.NAME.lock`` beside it) or refuse at once.

    The owner unlinks the lock file while it still holds the lock; a writer that locked a file
    which was unlinked meanwhile (the previous owner finished between our open and our flock)
    sees a different inode at the path and starts again, so two runs never both believe they
    own one output. A refused writer only closes its descriptor.
    """
    import fcntl

    path = Path(path)
    lock_path = path.with_name(hidden_name(path, "lock"))
    while True:
        try:
            fd = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o644)
        except OSError as exc:
            raise SpecsimError(f"cannot lock {str(path)!r}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise SpecsimError(
                f"{str(path)!r} is being written by another specsim run; wait for it to "
                f"finish or choose another {flag}"
            ) from None
        try:
            same = os.stat(lock_path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # we locked a lock file its owner had already removed: take the new one
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            lock_path.unlink()  # still holding it: nobody can be between open and flock on it
        os.close(fd)


@contextlib.contextmanager
def claim(
    path: str | Path | None,
    *,
    force: bool = False,
    suffixes: tuple[str, ...] = TABLE_SUFFIXES,
    flag: str = "--out",
) -> Iterator[Path | None]:
    """``with claim(args.out, force=args.force) as out:`` around a command's whole run.

    Checked before the work (``check_out``) and locked until the block ends, so a second run to
    the same output is refused at its start. Under the lock the existence check is repeated: a
    run that finished between our check and our lock has written the file we were about to
    replace. ``None`` (no output asked for) yields None.
    """
    if path is None:
        yield None
        return
    p = check_out(path, force=force, suffixes=suffixes, flag=flag)
    with lock(p, flag=flag):
        if p.exists() and not force:
            raise SpecsimError(f"{flag} {str(p)!r} already exists; pass --force to overwrite it")
        _remove_stale_temporaries(p)
        yield p


def _remove_stale_temporaries(path: Path) -> None:
    """Remove the temporaries a killed writer of ``path`` left (``kill -9`` skips ``atomic``'s
    cleanup). Called under ``path``'s lock: every writer of it holds that lock for its whole
    run, so no live writer owns one of them. Only names ``atomic`` makes for this very output
    (its hidden prefix, eight random characters, ``.tmp``) are touched."""
    prefix = hidden_name(path, "", room=8 + len(".tmp"))
    folder = path.parent if str(path.parent) else Path(".")
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            name = entry.name
            if (
                name.startswith(prefix)
                and name.endswith(".tmp")
                and len(name) == len(prefix) + 8 + len(".tmp")
                and entry.is_file(follow_symlinks=False)
            ):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


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
