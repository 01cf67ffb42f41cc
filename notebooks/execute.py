"""Execute notebooks top to bottom and write the executed copies to a folder.

    python notebooks/execute.py                       # all, into notebooks/executed/
    python notebooks/execute.py 01-quickstart         # the ones whose name starts so
    python notebooks/execute.py --out ~/runs          # copies into a folder of your choice
    python notebooks/execute.py my.ipynb              # a notebook file anywhere
    python notebooks/execute.py --in-place            # maintainers: refresh the committed ones

Why copies by default: the committed notebooks are executed (a reader browsing the repository
sees their tables and figures), so running them is how a user tries them; rewriting them in
place left every user's checkout modified with new outputs, timings and ids. ``--out``
(default ``notebooks/executed/``, which git ignores) takes the copies; ``--in-place`` is for
refreshing the committed outputs. Needs the ``notebook`` extra (``pip install -e '.[notebook]'``).

Runs from the repository root (as the tests do), with progress bars off and matplotlib's inline
backend (so the figures are stored in the notebook), and writes each notebook to a temporary
name before renaming it (an interrupted run leaves the old copy). Notebook 04 records with a
real model: it needs the ``record`` extra.

Every input is checked before the first kernel starts (the notebooks parse, the folders are
writable, an ``--in-place`` notebook is not read-only), so a mistake is one line and exit 2 with
nothing written. A notebook whose cell raises, or whose kernel dies, is one line naming the cell
and exit 1; its copy is not written, and the ``--out`` folder is only created for a finished copy.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import stat
import sys
from pathlib import Path
from typing import Any

from specsim.errors import LineParser, RunFailed, SpecsimError, run_script

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "notebooks" / "executed"
CELL_TIMEOUT_S = 1800
PROG = "execute.py"


def _parser() -> argparse.ArgumentParser:
    p = LineParser(prog="python notebooks/execute.py", description=__doc__.split("\n")[0])
    p.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help="notebooks/ notebooks whose name starts so, or .ipynb files (default: all)",
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="folder for the executed copies (default notebooks/executed/, git-ignored, whose "
        "copies are replaced); in a folder of yours a copy of the same name needs --force",
    )
    p.add_argument(
        "--force", action="store_true", help="replace copies of the same name in your --out"
    )
    where.add_argument(
        "--in-place",
        action="store_true",
        help="rewrite the notebooks themselves (to refresh the committed outputs)",
    )
    return p


def _books(names: list[str]) -> list[Path]:
    """The notebooks to run: files named as such, and notebooks/ ones matching a prefix."""
    shipped = sorted((ROOT / "notebooks").glob("*.ipynb"))
    files = [Path(n) for n in names if n.endswith(".ipynb")]
    prefixes = [n for n in names if not n.endswith(".ipynb")]
    for f in files:
        if not f.is_file():
            raise SpecsimError(f"{f} is not a notebook file")
    picked = [b for b in shipped if any(b.stem.startswith(p) for p in prefixes)]
    for p in prefixes:
        if not p or not any(b.stem.startswith(p) for b in shipped):
            known = ", ".join(b.stem for b in shipped)
            raise SpecsimError(f"no notebook in notebooks/ starts with {p!r}; there are {known}")
    chosen = ([f.resolve() for f in files] + picked) if names else shipped
    return list(dict.fromkeys(chosen))  # a notebook named twice runs once


def _read(path: Path) -> Any:
    """The notebook at ``path``, or a one-line refusal: a file a user points at may be anything
    (empty, not JSON, not UTF-8, JSON of another shape), and nbformat answers each differently."""
    import nbformat

    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise SpecsimError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise SpecsimError(f"{path} is not a notebook: byte {exc.start} is not UTF-8") from None
    if not text.strip():
        raise SpecsimError(f"{path} is empty; give a notebook (.ipynb) saved by Jupyter")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        why = f"{exc.msg}, line {exc.lineno}"
        raise SpecsimError(f"{path} is not a notebook: not JSON ({why})") from None
    if not isinstance(raw, dict):
        kind = type(raw).__name__
        raise SpecsimError(f"{path} is not a notebook: its JSON is a {kind}, not an object")
    try:
        return nbformat.reads(text, as_version=4)
    except Exception as exc:  # noqa: BLE001 - nbformat raises many types for a malformed file
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SpecsimError(
            f"{path} is not a valid notebook ({why}); open it in Jupyter and save it"
        ) from None


def _writable(path: Path) -> bool:
    """Whether we may write ``path``: the OS says so AND its owner-write bit is set. The bit is
    the user's own word ("read-only"); root's os.access ignores it, and a rename replaces a
    read-only file whenever its folder is writable, so the bit is checked, not left to the OS."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    flags = os.W_OK | (os.X_OK if stat.S_ISDIR(mode) else 0)
    return os.access(path, flags) and bool(mode & stat.S_IWUSR)


def _nearest_existing(path: Path) -> Path:
    """The first of ``path`` and its parents that exists (where a new folder would be made)."""
    for p in (path, *path.parents):
        if p.exists():
            return p
    return Path(path.anchor or ".")


def _check_out(out: Path, books: list[Path], force: bool = True) -> None:
    """An ``--out`` folder that a finished run can write into, checked before any kernel runs;
    in a folder of the user's (``force`` False), a notebook already there is theirs: kept."""
    if out.exists() and not out.is_dir():
        raise SpecsimError(f"--out {out} is a file; give a folder (it is created if missing)")
    base = _nearest_existing(out)
    if not base.is_dir():
        raise SpecsimError(f"--out {out}: {base} is a file, not a folder; give another --out")
    if not _writable(base):
        raise SpecsimError(f"--out {out}: folder {base} is read-only; choose another --out")
    if any(out.resolve() == b.parent for b in books):
        raise SpecsimError(
            f"--out {out} is where the notebooks are; pass --in-place to rewrite them"
        )
    for dest in (out / b.name for b in books):
        if dest.exists() and (dest.is_dir() or not _writable(dest)):
            raise SpecsimError(f"--out {out}: {dest} is read-only or a folder; choose another")
        if dest.exists() and not force:
            raise SpecsimError(
                f"--out {out}: {dest} exists; pass --force to replace it, or choose another --out"
            )
    names = [b.name for b in books]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SpecsimError(
            f"two notebooks are named {twice[0]}; their copies would replace each other in "
            f"--out {out}; run them into separate --out folders"
        )


def _check_in_place(books: list[Path]) -> None:
    """``--in-place`` rewrites each notebook: refuse a read-only one, or one in a read-only folder
    (where the temporary copy cannot be made), before any kernel runs."""
    for b in books:
        if not _writable(b):
            raise SpecsimError(f"--in-place: {b} is read-only; make it writable or use --out DIR")
        if not _writable(b.parent):
            raise SpecsimError(f"--in-place: folder {b.parent} is read-only; use --out DIR")


def _kernel_config() -> Any:
    """Kernel-manager settings: CurveZMQ encryption where this jupyter_client and the kernel
    support it. Without it ipykernel warns "running over TCP without encryption" once per
    notebook; encrypting removes the cause, so no warning (or other output) is filtered."""
    from jupyter_client.manager import KernelManager
    from traitlets.config import Config

    try:
        import zmq

        curve = bool(zmq.has("curve"))
    except ImportError:
        curve = False
    if curve and "transport_encryption" in KernelManager.class_trait_names():
        return Config({"KernelManager": {"transport_encryption": "auto"}})
    return Config()


def _execute(book: Any, name: str) -> None:
    """Run ``book`` in a fresh python3 kernel; a cell that raises, a dead kernel or a cell past
    the time limit is a one-line :class:`RunFailed` (exit 1) naming the cell."""
    import nbclient
    from jupyter_client.kernelspec import NoSuchKernel
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    running = {"index": -1}

    def started(cell: Any, cell_index: int) -> None:
        running["index"] = cell_index

    client = nbclient.NotebookClient(
        book,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(ROOT)}},
        on_cell_execute=started,
        config=_kernel_config(),
    )

    def where() -> str:
        i = running["index"]
        return f"cell {i + 1} of {len(book.cells)}" if i >= 0 else "its start (before any cell)"

    try:
        client.execute()
    except CellExecutionError as exc:
        raise RunFailed(f"{name}: {where()} raised {_last_line(exc)}") from None
    except CellTimeoutError:
        raise RunFailed(f"{name}: {where()} ran past {CELL_TIMEOUT_S} s; stopped") from None
    except DeadKernelError:
        raise RunFailed(
            f"{name}: the kernel died running {where()} (the cell exited the process, or it ran "
            "out of memory); fix the cell"
        ) from None
    except RuntimeError as exc:  # nbclient's word for a kernel that would not start or reply
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise RunFailed(f"{name}: the kernel failed at {where()} ({why})") from None
    except NoSuchKernel:
        raise SpecsimError(
            "no python3 Jupyter kernel is installed; install the notebook extra: "
            "pip install -e '.[notebook]'"
        ) from None


def _last_line(exc: Any) -> str:
    """``Name: last line of the message``: what a reader of the traceback's end would see."""
    lines = [ln for ln in str(exc.evalue or "").splitlines() if ln.strip()]
    return f"{exc.ename}: {lines[-1].strip()}" if lines else str(exc.ename)


def _write(book: Any, dest: Path) -> None:
    """Write ``book`` to ``dest`` through a temporary name; an ``--out`` folder made for it is
    removed again if the write fails, so a failed run leaves no empty folder behind."""
    import nbformat

    from specsim.outputs import writing

    made = [p for p in (dest.parent, *dest.parent.parents) if not p.exists()]
    try:
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SpecsimError(f"could not create {dest.parent} ({exc.strerror})") from None
        with writing(dest) as tmp:  # an OS failure is one line naming dest
            nbformat.write(book, tmp)
    except SpecsimError:
        for p in made:  # deepest first; only folders this run made, and only while empty
            try:
                p.rmdir()
            except OSError:
                break
        raise


def _prepare(args: argparse.Namespace) -> tuple[list[tuple[Path, Any]], Path | None]:
    """Everything checked before the first kernel: the notebooks parse, the outputs can be
    written. A run of minutes must not end in a mistake that was visible at the start."""
    if args.out is not None and not args.out.strip():
        raise SpecsimError("--out is empty; give a folder")
    books = _books(args.names)
    out = None if args.in_place else Path(args.out).expanduser() if args.out else DEFAULT_OUT
    if out is None:
        _check_in_place(books)
    else:
        _check_out(out, books, force=args.force or out == DEFAULT_OUT)
    return [(path, _read(path)) for path in books], out


def _run(args: argparse.Namespace) -> int:
    """Execute each notebook and write it; raises :class:`SpecsimError` on the first failure."""
    loaded, out = _prepare(args)
    os.environ.update(SPECSIM_PROGRESS="0", HF_HUB_OFFLINE="1")
    os.environ.pop("MPLBACKEND", None)  # the kernel's inline backend: figures land in the file
    for path, book in loaded:
        print(f"executing {path.name}", file=sys.stderr, flush=True)
        _execute(book, path.name)
        dest = path if out is None else out / path.name
        _write(book, dest)
        print(f"wrote {dest}", file=sys.stderr, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        import nbclient  # noqa: F401
        import nbformat  # noqa: F401
    except ImportError as exc:
        print(
            f"{PROG}: error: {exc.name} is missing; install the notebook extra: "
            "pip install -e '.[notebook]'",
            file=sys.stderr,
        )
        return 2
    try:
        return run_script(PROG, lambda: _run(args))
    except KeyboardInterrupt:
        print(f"{PROG}: error: interrupted; nothing half-written was left", file=sys.stderr)
        return 128 + signal.SIGINT


if __name__ == "__main__":
    sys.exit(main())
