"""The notebooks are committed executed (a reader browsing the repository sees the tables and
figures) and still run top to bottom on CPU (nbclient, kernel python3): each runs in a copy, from
the repository root. Re-execute them in place with ``python notebooks/execute.py --in-place``
(without it, the executed copies go to ``notebooks/executed/``: tests/test_newcomer_v3.py).

The per-cell time limit is generous and scales (``SPECSIM_TEST_TIMEOUT_SCALE``): notebook 04
records with a real model, 43 s on an idle machine and several minutes on a loaded one, and a
test must not depend on a quiet machine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = int(1800 * float(os.environ.get("SPECSIM_TEST_TIMEOUT_SCALE", "1")))


def test_there_are_notebooks():
    names = [p.name for p in NOTEBOOKS]
    for want in ("01-quickstart", "02-scheduler-comparison", "03-losslessness", "04-recording"):
        assert any(n.startswith(want) for n in names), f"notebooks/{want}*.ipynb is missing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_executed_without_errors(path):
    book = nbformat.read(path, as_version=4)
    code = [c for c in book.cells if c.cell_type == "code"]
    assert code, f"{path.name} has no code"
    counts = [c.execution_count for c in code]
    assert None not in counts, (
        f"{path.name}: not executed; run python notebooks/execute.py --in-place"
    )
    assert counts == sorted(counts), f"{path.name}: cells ran out of order; re-execute it"
    for cell in code:
        for out in cell.outputs:
            assert out.output_type != "error", f"{path.name}: committed with an error output"


def _marks(path: Path) -> list:
    """Notebook 04 records with a real model: it needs the ``record`` extra and is slow."""
    if "recording" in path.stem:
        return [pytest.mark.record, pytest.mark.slow]
    if path.stem.startswith("01"):
        return []
    return [pytest.mark.slow]  # 13-25 s each on a loaded machine


@pytest.mark.slow  # fast suite under 5 min: over 2.8 s alone (CI runs it)
@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem, marks=_marks(p)) for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path, monkeypatch):
    if "recording" in path.stem:
        pytest.importorskip("torch")
        pytest.importorskip("transformers")
    monkeypatch.setenv("SPECSIM_PROGRESS", "0")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    book = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        book,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(ROOT)}},
    )
    client.execute()  # raises CellExecutionError naming the failing cell
    errors = [
        out
        for cell in book.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if out.get("output_type") == "error"
    ]
    assert not errors
    assert os.fspath(path).endswith(".ipynb")
