"""The notebooks run top to bottom on CPU (nbclient, kernel python3) and are committed without
outputs. Each runs in a copy, from the repository root, with a time limit per cell."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 300


def test_there_are_notebooks():
    names = [p.name for p in NOTEBOOKS]
    for want in ("01-quickstart", "02-scheduler-comparison", "03-losslessness", "04-recording"):
        assert any(n.startswith(want) for n in names), f"notebooks/{want}*.ipynb is missing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_without_outputs(path):
    book = nbformat.read(path, as_version=4)
    for cell in book.cells:
        if cell.cell_type == "code":
            assert not cell.outputs, f"{path.name}: a code cell has outputs; clear them"
            assert cell.execution_count is None, f"{path.name}: clear execution counts"


def _marks(path: Path) -> list:
    """Notebook 04 records with a real model: it needs the ``record`` extra and is slow."""
    if "recording" in path.stem:
        return [pytest.mark.record, pytest.mark.slow]
    return []


@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem, marks=_marks(p)) for p in NOTEBOOKS])
def test_notebook_runs_top_to_bottom(path, monkeypatch):
    if _marks(path):
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
