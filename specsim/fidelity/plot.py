"""The fidelity figure: simulated against measured per metric, and the error histogram."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from specsim.fidelity.metrics import GOAL
from specsim.fidelity.tables import PANELS


def plot_fidelity(table: pd.DataFrame, path: Path, clock: str = "cpu") -> Path:
    """Simulated against measured for four metrics (one marker per policy, colour per drafter
    family via the shared palette), and a histogram of the relative errors."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    from specsim.analysis.palette import policy_style

    fig = plt.figure(figsize=(15, 8.2))
    gs = fig.add_gridspec(2, 3)
    axes = [fig.add_subplot(gs[i // 2, i % 2]) for i in range(4)]
    hist_ax = fig.add_subplot(gs[:, 2])
    drafters = list(dict.fromkeys(table["drafter"]))
    fills = {d: (i == 0) for i, d in enumerate(drafters)}
    for ax, (m, label) in zip(axes, PANELS, strict=True):
        for (pol, d), grp in table.groupby(["policy", "drafter"], sort=False):
            st = policy_style(str(pol))
            marker = st.marker or "o"
            filled = marker not in ("x", "+", "1", "2", "3", "4", "|", "_")
            style = (
                {"facecolors": st.color if fills[d] else "none", "edgecolors": st.color}
                if filled
                else {"c": st.color, "alpha": 1.0 if fills[d] else 0.45}
            )
            ax.scatter(
                grp[f"real_{m}"],
                grp[f"sim_{m}"],
                marker=marker,
                label=f"{pol} ({d})",
                s=36,
                zorder=3,
                **style,
            )
        vals = pd.concat([table[f"real_{m}"], table[f"sim_{m}"]]).replace([np.inf, -np.inf], np.nan)
        vals = vals.dropna()
        vals = vals[vals > 0]
        lo, hi = float(vals.min()) * 0.8, float(vals.max()) * 1.25
        xs = np.geomspace(lo, hi, 50)
        g = GOAL[m]
        ax.plot(xs, xs, "k--", lw=1, label="sim = real")
        ax.fill_between(xs, xs * (1 - g), xs * (1 + g), color="0.85", zorder=0,
                        label=f"within {100 * g:.0f}% (goal)")  # fmt: skip
        ax.set_xscale("log")
        ax.set_yscale("log")
        for axis in (ax.xaxis, ax.yaxis):  # plain numbers at 1-2-5 steps, no minor labels
            axis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(NullFormatter())
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel(f"real engine ({clock} clock): {label}")
        ax.set_ylabel(f"simulator: {label}")
        ax.set_title(f"{label.split(' (')[0]}: simulated vs measured")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), fontsize=8)
    # the throughput error on every clock the table has: the scatter panels use one clock, the
    # histogram shows what the others say about the same runs
    from specsim.fidelity.tables import CLOCKS, with_raw_clock

    bins = np.linspace(-0.4, 0.4, 41)
    t = with_raw_clock(table)
    for (name, prefix, _), color in zip(CLOCKS, ("tab:blue", "tab:orange", "tab:red"), strict=True):
        col = f"{prefix}err_throughput_tok_s"
        if col not in t:
            continue
        e = t[col].to_numpy(np.float64)
        e = e[np.isfinite(e)]
        if not e.size:
            continue
        med = 100 * float(np.median(np.abs(e)))
        hist_ax.hist(np.clip(e, -0.4, 0.4), bins=bins, histtype="step", lw=1.8, color=color,
                     label=f"{name} clock: {e.size} cells, median |error| {med:.1f}%")  # fmt: skip
    for x in (-0.05, 0.05):
        hist_ax.axvline(x, color="0.5", ls=":", lw=1)
    hist_ax.set_xlabel("throughput error (sim - real) / real (clipped at +-40%)")
    hist_ax.set_ylabel("cells")
    hist_ax.set_title("throughput error on three clocks (dotted: +-5%)")
    hist_ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    from specsim.outputs import atomic

    with atomic(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return path
