"""Execute every notebook in place, top to bottom, so the committed copies show their outputs.

    python notebooks/execute.py                 # all of them
    python notebooks/execute.py 01-quickstart   # the ones whose name starts so

Runs from the repository root (as the tests do), with progress bars off and matplotlib's inline
backend (so the figures are stored in the notebook), and
writes each notebook to a temporary name before renaming it (an interrupted run leaves the old
copy). Notebook 04 records with a real model: it needs the ``record`` extra.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbclient
import nbformat

ROOT = Path(__file__).resolve().parent.parent


def main(prefixes: list[str]) -> int:
    os.environ.update(SPECSIM_PROGRESS="0", HF_HUB_OFFLINE="1")
    os.environ.pop("MPLBACKEND", None)  # the kernel's inline backend: figures land in the file
    books = sorted((ROOT / "notebooks").glob("*.ipynb"))
    for path in books:
        if prefixes and not any(path.stem.startswith(p) for p in prefixes):
            continue
        print(f"executing {path.name}", file=sys.stderr, flush=True)
        book = nbformat.read(path, as_version=4)
        client = nbclient.NotebookClient(
            book, timeout=1800, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}
        )
        client.execute()
        tmp = path.with_name(f".{path.name}.tmp")
        nbformat.write(book, tmp)
        os.replace(tmp, path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
