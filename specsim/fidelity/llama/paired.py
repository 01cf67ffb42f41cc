"""Each kept run of a cell against its own simulation: the paired score of a grid whose runs
each send jobs of their own seed (``--arrival-seeds per-run``).

Why: a cell's real interval (:func:`specsim.fidelity.repeats.median_interval` over its runs)
holds everything that moves a run, the draw of arrivals and answers included, which the
simulator replays exactly from the run's seed and trace draw. On held-out-11 the open loops'
throughput moved 54-64% from run to run and the per-run ratio sim / real only 2-8% in five of
six target-only cells (reports/llama-cpp-v4/held-out-11/NOTES.md). The paired error of a cell
is the median over its runs of sim_i / real_i - 1, with the 95% interval of that median; a
cell is *paired-tight* where the interval is within the grid's tolerance. What pairing cannot
take out (the machine's speed from run to run) stays in the interval.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from specsim.fidelity.repeats import median_interval

SHORT = {"throughput_tok_s": "throughput", "tpot_ms_mean": "tpot_mean"}


def paired_columns(runs: pd.DataFrame, sims: Sequence[dict], tol: float) -> dict[str, float]:
    """A cell's paired columns from its kept ``runs`` (rows of ``runs.csv``) and each run's
    simulated summary ``sims`` (same order): per metric the median ratio's error, its 95%
    interval's half-width and the runs' spread of ratios; ``paired_tight`` where both metrics'
    intervals are within ``tol``."""
    if len(runs) != len(sims):
        raise ValueError("paired_columns: one simulated summary per run")
    out: dict[str, float] = {}
    tight = True
    for m, short in SHORT.items():
        real = runs[m].to_numpy(np.float64)
        sim = np.array([float(s.get(m, np.nan)) for s in sims], dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = sim / real
        ratio = ratio[np.isfinite(ratio) & (ratio > 0)]
        iv = median_interval(ratio)
        out[f"paired_err_{short}"] = iv.median - 1.0 if iv.n else np.nan
        out[f"paired_ci_{short}"] = iv.half_width()
        out[f"paired_spread_{short}"] = float(ratio.max() - ratio.min()) if iv.n else np.nan
        tight = tight and iv.within(tol)
    out["paired_tight"] = tight
    return out


def section(table: pd.DataFrame, tol: float) -> str:
    """The README's section on the paired score (``table``: ``fidelity.csv`` with the paired
    columns)."""
    tight = table[table["paired_tight"].astype(bool)]

    def stats(t: pd.DataFrame, short: str) -> str:
        e = t[f"paired_err_{short}"].abs()
        if not len(e):
            return "no cell"
        return f"median **{100 * e.median():.1f}%**, worst {100 * e.max():.1f}%"

    spread = {s: 100 * table[f"paired_spread_{s}"].median() for s in SHORT.values()}
    return (
        "\n## Each run against its own simulation (paired; specsim/fidelity/llama/paired.py)\n\n"
        "Every kept run sent jobs of its own seed and is simulated on that seed (and its trace "
        "draw); a cell's paired error is the median over its runs of sim / real - 1, with the "
        "95% interval of that median. Over every cell: throughput "
        f"{stats(table, 'throughput')}, mean TPOT {stats(table, 'tpot_mean')} (the runs' "
        f"ratios spread {spread['throughput']:.0f}% and {spread['tpot_mean']:.0f}%, medians). "
        f"Cells whose paired interval is within +-{100 * tol:g}% on both: **{len(tight)} of "
        f"{len(table)}**; there, throughput {stats(tight, 'throughput')}, mean TPOT "
        f"{stats(tight, 'tpot_mean')}.\n"
    )
