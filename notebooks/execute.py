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
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "notebooks" / "executed"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python notebooks/execute.py",
        description=__doc__.split("\n")[0],
    )
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
        help="folder for the executed copies (default notebooks/executed/, git-ignored); "
        "a copy of the same name there is replaced",
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
            raise ValueError(f"{f} is not a notebook file")
    picked = [b for b in shipped if any(b.stem.startswith(p) for p in prefixes)]
    for p in prefixes:
        if not any(b.stem.startswith(p) for b in shipped):
            known = ", ".join(b.stem for b in shipped)
            raise ValueError(f"no notebook in notebooks/ starts with {p!r}; there are {known}")
    return ([f.resolve() for f in files] + picked) if names else shipped


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        import nbclient
        import nbformat
    except ImportError as exc:
        print(
            f"execute.py: error: {exc.name} is missing; install the notebook extra: "
            "pip install -e '.[notebook]'",
            file=sys.stderr,
        )
        return 2
    try:
        books = _books(args.names)
    except ValueError as exc:
        print(f"execute.py: error: {exc}", file=sys.stderr)
        return 2
    out = None if args.in_place else Path(args.out).expanduser() if args.out else DEFAULT_OUT
    if out is not None:
        if any(out.resolve() == b.parent for b in books):
            print(
                f"execute.py: error: --out {out} is where the notebooks are; pass --in-place to "
                "rewrite them",
                file=sys.stderr,
            )
            return 2
        out.mkdir(parents=True, exist_ok=True)
    os.environ.update(SPECSIM_PROGRESS="0", HF_HUB_OFFLINE="1")
    os.environ.pop("MPLBACKEND", None)  # the kernel's inline backend: figures land in the file
    for path in books:
        print(f"executing {path.name}", file=sys.stderr, flush=True)
        book = nbformat.read(path, as_version=4)
        client = nbclient.NotebookClient(
            book, timeout=1800, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
        )
        client.execute()
        dest = path if out is None else out / path.name
        tmp = dest.with_name(f".{dest.name}.tmp")
        nbformat.write(book, tmp)
        os.replace(tmp, dest)
        print(f"wrote {dest}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
