"""The resumable sweep every report runs into its folder's ``results.parquet``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from specsim.analysis.report import ReportContext


def cells_resumable(ctx: ReportContext, cells: list, out: Path) -> bool:
    """True when ``out`` may be resumed (it holds only cells of this grid)."""
    if not out.exists():
        return False
    try:
        old = pd.read_parquet(out, columns=["cell_key"])
    except Exception:  # noqa: BLE001 - unreadable: start again
        return True
    return set(old["cell_key"]) <= {c.key for c in cells}


def sweep_into_folder(
    ctx: ReportContext,
    traces: list[str],
    policies: list[str],
    name: str = "results.parquet",
    **kw: Any,
) -> pd.DataFrame:
    """A resumable sweep into the report folder's ``name`` (reset if the grid changed).
    ``kw``: :func:`~specsim.analysis.sweep.build_cells`' arguments; any other keyword is a
    replay option (``require_steady=True``, ...)."""
    import inspect

    from specsim.analysis.sweep import build_cells, run_cells

    known = set(inspect.signature(build_cells).parameters)
    options = {**kw.pop("options", {}), **{k: kw.pop(k) for k in list(kw) if k not in known}}
    cells = build_cells(traces, policies, options=options or None, **kw)
    out = ctx.folder / name
    force = not ctx.resume or (out.exists() and not cells_resumable(ctx, cells, out))
    table = run_cells(cells, out=out, workers=ctx.workers, force=force, progress=ctx.progress)
    ctx.written.append(out)
    count_cells(ctx, table, name)
    return table


def count_cells(ctx: ReportContext, table: pd.DataFrame, name: str) -> None:
    """Add a sweep's cells to the footer's account: how many were reused (``--resume``) and
    the replay seconds they all took when computed, so the page states what a regeneration
    from scratch costs, not only what this (perhaps resumed) run took."""
    ctx.cells_total += int(table.attrs["cells_total"])
    ctx.cells_reused += int(table.attrs["cells_reused"])
    if "wall_time_s" in table:
        ctx.cell_seconds += float(table["wall_time_s"].sum())
    if table.attrs["cells_reused"]:
        ctx.notes.append(
            f"{table.attrs['cells_reused']} of {table.attrs['cells_total']} sweep cells were "
            f"reused from `{name}` (same cell, same trace bytes, same result)"
        )
