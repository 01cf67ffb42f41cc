"""Whole figures for the CLI and the reports: panels laid out on one page, one legend.

The ``plot_*`` functions of :mod:`specsim.analysis.plots` draw one panel each (what a notebook
calls); ``figure(kind, ...)`` puts one panel (or panel group) per trace on a grid and
``save_figure`` writes it. Why a page: a sweep of the twenty shipped traces stacked one panel a
row made a 2400 x 4965 px poster no one could read or print. A figure now holds at most
``MAX_COLS`` columns and its long side at most ``PAGE_IN`` inches (2,400 px at the 150 dpi
``save_figure`` writes); more panels than a page holds legibly is a one-line error that names
``--trace``, not an unreadable file.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from specsim.analysis.palette import policy_label, policy_style
from specsim.analysis.plots import (
    KINDS,
    LOAD_LABEL,
    _plt,
    _policies,
    plot_calibration,
    plot_load,
    plot_pareto,
    plot_sla,
)
from specsim.errors import SpecsimError
from specsim.outputs import writing

PAGE_IN = 16.0  # the long side of a figure (inches): 2,400 px at save_figure's 150 dpi
MAX_COLS = 4  # panels side by side, at most
MIN_PANEL_IN = 2.0  # shorter than this (after scaling to a page), a panel is not legible
DPI = 150


def page_grid(
    n: int, panel: tuple[float, float], *, cols: int | None = None, head_in: float = 0.9
) -> tuple[int, int, tuple[float, float]]:
    """(rows, columns, figure size in inches) for ``n`` panels of ``panel`` (width, height).

    Columns: all panels in one row when that row fits a page at full size; otherwise about
    sqrt(n x height / width), which makes the grid roughly square (2 x 2 for four pareto panels,
    4 x 6 for twenty-one; wide SLA panels stack in fewer columns), at most ``MAX_COLS``. ``cols``
    fixes them instead (a row of panels per trace). The whole figure, ``head_in`` inches of
    title and legend included, is then scaled down to fit ``PAGE_IN`` on its long side; a
    figure whose panels would shrink below ``MIN_PANEL_IN`` is refused (see :func:`fits_page`).
    """
    if cols is None:
        if n * panel[0] + 0.4 <= PAGE_IN:
            cols = max(n, 1)
        else:
            cols = min(n, MAX_COLS, max(1, math.ceil(math.sqrt(n * panel[1] / panel[0]))))
    rows = -(-n // cols)
    w, h = panel[0] * cols + 0.4, panel[1] * rows + head_in
    scale = min(1.0, PAGE_IN / max(w, h))
    return rows, cols, (w * scale, h * scale)


def fits_page(n: int, panel: tuple[float, float], **kw: Any) -> bool:
    """Whether ``n`` panels keep at least ``MIN_PANEL_IN`` on each side on one page."""
    _, cols, (w, _) = page_grid(n, panel, **kw)
    scale = w / (panel[0] * cols + 0.4)  # the page's shrink, the same on both sides
    return min(panel) * scale >= MIN_PANEL_IN


def _page(kind: str, n: int, panel: tuple[float, float], **kw: Any) -> tuple:
    if not fits_page(n, panel, **kw):
        most = max((k for k in range(1, n) if fits_page(k, panel, **kw)), default=1)
        raise SpecsimError(
            f"{n} traces do not fit one legible page of --kind {kind} (at most {most}); pick "
            "some with --trace NAME (repeatable; traces= in Python)"
        )
    return page_grid(n, panel, **kw)


def _wrap_title(text: str, width_in: float, fontsize: float = 12.0) -> str:
    """Wrap a suptitle to the figure's width (about 1.9 characters per inch per 10 pt)."""
    import textwrap

    chars = max(20, int(width_in * 19.0 / fontsize * 10.0 / 1.55))
    return "\n".join(textwrap.wrap(text, chars))


def _policy_handles(pols: list[str], bars: bool = False) -> list[Any]:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    if bars:
        return [
            Patch(
                facecolor=policy_style(p).color,
                hatch=policy_style(p).hatch,
                label=policy_label(p),
                edgecolor="white",
            )  # fmt: skip
            for p in pols
        ]
    return [
        Line2D([], [], label=policy_label(p), markersize=5, **policy_style(p).kwargs())
        for p in pols
    ]


def _outer_labels(axes: Any, n: int) -> str:
    """Axis labels on the grid's edge only; returns the y label the caller puts on the figure.

    Every panel of a grid plots the same quantities, and twenty copies of each label took a
    third of the page. The x label stays on the lowest panel of each column; the y label, on a
    grid of several rows, becomes one label for the whole left edge (returned, else ""): on a
    short panel a long one ("throughput per GPU at the SLA (tok/s)") ran into the next row's.
    """
    rows, cols = axes.shape
    ylabel = axes[0, 0].get_ylabel() if rows > 1 else ""
    for i, ax in enumerate(axes.ravel()[:n]):
        r, c = divmod(i, cols)
        if c or ylabel:
            ax.set_ylabel("")
        if r < rows - 1 and (r + 1) * cols + c < n:  # a panel below carries the label
            ax.set_xlabel("")
    return ylabel


def _drop_policy_legends(axes: Any) -> None:
    for ax in np.asarray(axes).ravel():
        leg = ax.get_legend()
        if leg is not None and (leg.get_title().get_text() or "").startswith("policy"):
            leg.remove()


def figure(
    kind: str,
    data: Any,
    *,
    targets: list[float] | None = None,
    baseline: str | None = "mtp1",
    traces: list[str] | None = None,
    policies: list[str] | None = None,
    title: str | None = None,
) -> Any:
    """A whole Figure of ``kind``: one panel (or panel group) per trace, one shared legend.

    ``policies``: draw only these (default: all in the table, in table order).
    """
    plt = _plt()
    if kind not in KINDS:
        raise SpecsimError(f"unknown plot kind {kind!r}; choose one of {', '.join(KINDS)}")
    if kind == "calibration":
        fig, axes = plt.subplots(1, 2, figsize=(11, 5), sharey=True)
        plot_calibration(data, axes)
        src = Path(getattr(data, "path", "") or "trace").stem
        fig.suptitle(title or f"calibration of the survival a_k: {src}")
        fig.tight_layout()
        return fig
    table = data
    if policies is not None:
        missing = [p for p in policies if p not in set(table["policy"])]
        if missing:
            raise SpecsimError(f"policy {missing[0]!r} is not in the table; sweep it first")
        table = table[table["policy"].isin(policies)]
    names = traces or list(dict.fromkeys(table["trace"].astype(str)))
    n = len(names)
    pols = _policies(table)
    profile = ", ".join(sorted(set(table["profile"].astype(str)))) if "profile" in table else ""
    ylabel = ""  # a y label for the figure's whole left edge (a grid of several rows)
    if kind == "load":  # one row per trace, the four metrics side by side
        _, _, size = _page(kind, n, (13.6, 2.9), cols=1, head_in=1.6)
        fig, axes = plt.subplots(n, 4, figsize=size, squeeze=False)
        for i, name in enumerate(names):
            plot_load(table, axes[i], trace=name)
            for ax in axes[i]:
                ax.set_title(f"{ax.get_title()}: {name}", fontsize=9)
    else:  # a grid of one panel per trace
        if kind == "sla" and not targets:
            raise SpecsimError("the sla plot needs SLA targets: pass --sla 80,120")
        panel = (
            (5.2, 4.6)
            if kind == "pareto"
            else (max(7.0, 0.22 * len(pols) * len(targets) + 2.0), 3.8)
        )
        rows_p, cols, size = _page(kind, n, panel)
        fig, axes = plt.subplots(rows_p, cols, figsize=size, squeeze=False)
        for ax, name in zip(axes.ravel(), names, strict=False):
            if kind == "pareto":
                plot_pareto(table, ax, trace=name)
            else:
                plot_sla(table, targets, ax, baseline=baseline, trace=name)
            ax.set_title(f"trace {name}", fontsize=10)
        for ax in axes.ravel()[n:]:
            ax.set_visible(False)
        ylabel = _outer_labels(axes, n)
    _drop_policy_legends(axes)
    default = {
        "pareto": "throughput against per-user speed",
        "sla": "throughput at SLA targets"
        + (f", value and % gain over {baseline} on each bar" if baseline else ""),
        "load": "speculation and latency against load",
    }[kind]
    fig_w, fig_h = fig.get_size_inches()
    text = _wrap_title(title or (f"{default} ({profile})" if profile else default), fig_w)
    title_h = 0.3 + 0.25 * text.count("\n")  # inches
    fig.suptitle(text, y=1 - 0.12 / fig_h, va="top")
    ncols = min(len(pols), max(3, int(fig_w // 1.7)))
    # the legend sits under the title, where a reader of a tall figure looks first
    legend = fig.legend(
        handles=_policy_handles(pols, bars=kind == "sla"),
        title="policy",
        loc="upper center",
        bbox_to_anchor=(0.5, 1 - (0.12 + title_h) / fig_h),
        ncols=ncols,
        fontsize=8,
        title_fontsize=8,
        frameon=False,
    )
    # the panels start just under the legend's measured bottom edge
    bottom = legend.get_window_extent(fig.canvas.get_renderer()).y0 / fig.dpi  # inches
    left = 0.0
    if ylabel:
        fig.supylabel(ylabel, x=0.08 / fig_w, ha="left", fontsize=10)
        left = 0.4 / fig_w
    fig.tight_layout(rect=(left, 0, 1, (bottom - 0.05) / fig_h), pad=0.5)
    # tight_layout leaves slack above the first row of panels: close it up to the legend
    renderer = fig.canvas.get_renderer()
    tops = [ax.get_tightbbox(renderer).y1 / fig.dpi for ax in fig.axes if ax.get_visible()]
    slack = (bottom - 0.1) - max(tops) if tops else 0.0
    if slack > 0:
        fig.subplots_adjust(top=min(fig.subplotpars.top + slack / fig_h, 0.99))
    return fig


def ratio_figure(
    ratios: pd.DataFrame,
    *,
    value: str = "ratio",
    label: str = "",
    title: str = "",
    span: float = 0.10,
) -> Any:
    """Heat maps of one ratio per (trace, load), one panel per profile: ``ratios`` has columns
    profile, trace, load and ``value``. Cells print the value; the colour is centred at 1.0
    (red below: worse than the reference; blue above) and reaches full depth at 1 -/+ ``span``
    or the data's extremes, whichever is further: a 1% gap stays pale, not deep red.

    The panels share their rows, so only the first column prints the trace names (long names
    otherwise run into the panel to their left), and constrained layout spaces the panels and
    the colour bar."""
    from matplotlib.colors import TwoSlopeNorm

    plt = _plt()
    profiles = list(dict.fromkeys(ratios["profile"].astype(str)))
    traces = list(dict.fromkeys(ratios["trace"].astype(str)))
    loads = sorted(set(ratios["load"].astype(float)))
    n = len(profiles)
    cols = min(n, 2)
    rows_p = -(-n // cols)
    fig, axes = plt.subplots(
        rows_p,
        cols,
        figsize=(0.9 * len(loads) * cols + 3.2, 0.5 * len(traces) * rows_p + 1.6 * rows_p + 0.8),
        squeeze=False,
        sharey=True,
        layout="constrained",
    )
    v = ratios[value].to_numpy(dtype=float)
    lo, hi = float(np.nanmin(v)), float(np.nanmax(v))
    norm = TwoSlopeNorm(vcenter=1.0, vmin=min(lo, 1.0 - span), vmax=max(hi, 1.0 + span))
    im = None
    for k, (ax, prof) in enumerate(zip(axes.ravel(), profiles, strict=False)):
        sub = ratios[ratios["profile"].astype(str) == prof]
        grid = sub.pivot_table(index="trace", columns="load", values=value, aggfunc="mean")
        grid = grid.reindex(index=traces, columns=loads)
        im = ax.imshow(grid.to_numpy(), cmap="RdBu", norm=norm, aspect="auto")
        for (i, j), x in np.ndenumerate(grid.to_numpy()):
            if np.isfinite(x):
                dark = abs(float(norm(x)) - 0.5) > 0.35  # white text on the deepest colours
                ax.text(j, i, f"{x:.3f}", ha="center", va="center", fontsize=7,
                        color="white" if dark else "black")  # fmt: skip
        ax.set_xticks(range(len(loads)), [f"{c:g}" for c in loads], fontsize=8)
        ax.set_yticks(range(len(traces)), traces, fontsize=8)
        if k % cols:
            ax.tick_params(labelleft=False)
        ax.set_xlabel(LOAD_LABEL["concurrency"], fontsize=9)
        ax.set_title(f"profile {prof}", fontsize=10)
    for ax in axes.ravel()[n:]:
        ax.set_visible(False)
    if im is not None:
        fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.8, label=label or value)
    fig.suptitle(_wrap_title(title or label or value, fig.get_size_inches()[0]))
    return fig


def save_figure(fig: Any, out: str | Path, *, force: bool = False, dpi: int = DPI) -> Path:
    """Save as png/svg/pdf (by suffix) to a temporary name, then rename into place."""
    out = Path(out)
    fmt = out.suffix.lower().lstrip(".")
    if fmt not in ("png", "svg", "pdf"):
        raise SpecsimError(f"--out {str(out)!r} must end in .png, .svg or .pdf")
    if out.exists() and not force:
        raise SpecsimError(f"{out} exists; pass --force to overwrite it")
    if not out.parent.exists():
        raise SpecsimError(f"folder {str(out.parent)!r} does not exist; create it first")
    with writing(out) as tmp:
        fig.savefig(tmp, format=fmt, dpi=dpi, metadata=_metadata(fmt))
    return out


def _metadata(fmt: str) -> dict[str, Any]:
    """No timestamps in the files, so the same data gives the same bytes."""
    if fmt == "png":
        return {"Software": None}
    if fmt == "svg":
        return {"Date": None}
    return {"CreationDate": None}
