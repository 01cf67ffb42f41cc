"""The llama-server fidelity report: ``README.md`` (method, rerun command, machine and load,
the results against the issue's goals, every cell) and ``fidelity.png``."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from specsim.fidelity.llama.config import LlamaValidationConfig

GOAL_MEDIAN, GOAL_MAX, GOAL_ACCEPT = 0.05, 0.10, 0.03


def goals(table: pd.DataFrame) -> dict[str, float]:
    """The issue's goals, measured: median and worst |error| of throughput and mean TPOT, and
    the worst relative gap of accepted-per-drafted between the trace and the server."""
    out: dict[str, float] = {"cells": float(len(table))}
    for m in ("throughput", "tpot_mean"):
        e = np.abs(table[f"err_{m}_wall"].to_numpy(np.float64))
        out[f"{m}_median_abs"] = float(np.nanmedian(e))
        out[f"{m}_max_abs"] = float(np.nanmax(e))
        out[f"{m}_within_5"] = float(np.mean(e <= GOAL_MEDIAN))
        out[f"{m}_within_10"] = float(np.mean(e <= GOAL_MAX))
    spec = table[table["real_accept_per_draft"] > 0]  # cells where the server accepted drafts
    gap = (spec["sim_accept_per_draft"] / spec["real_accept_per_draft"] - 1.0).abs()
    out["accept_gap_max"] = float(gap.max()) if len(gap) else float("nan")
    out["accept_gap_median"] = float(gap.median()) if len(gap) else float("nan")
    if "converged" in table.columns:  # the goals where the real cell's interval is tight
        tight = table[table["converged"].astype(bool)]
        out["converged_cells"] = float(len(tight))
        for m in ("throughput", "tpot_mean"):
            e = np.abs(tight[f"err_{m}_wall"].to_numpy(np.float64))
            out[f"{m}_median_abs_converged"] = float(np.nanmedian(e)) if len(e) else np.nan
            out[f"{m}_max_abs_converged"] = float(np.nanmax(e)) if len(e) else np.nan
    gain = gains(table)
    if len(gain):
        out["gain_gap_max_points"] = float(gain["gap_points"].abs().max())
        judged = gain[gain["real_gain"].abs() >= GAIN_SIGN_FLOOR]
        wrong = np.sign(judged["real_gain"]) != np.sign(judged["sim_gain"])
        out["gain_signs_judged"], out["gain_signs_wrong"] = float(len(judged)), float(wrong.sum())
    pooled = accept_pooled(table)
    out["accept_gap_pooled_max"] = float(pooled["gap"].abs().max()) if len(pooled) else np.nan
    return out


GAIN_SIGN_FLOOR = 0.02  # a real gain within +-2% has no sign worth judging


def gains(table: pd.DataFrame) -> pd.DataFrame:
    """The gain of each speculative setting over ``none`` at the same load and temperature,
    the server's and the simulator's (tidy: a row per setting, temperature, load). The metric a
    user would read there: output throughput in a closed loop, and in an open loop the mean
    TPOT's speed-up (``none``'s TPOT over the setting's, minus 1), since an open loop's
    throughput is its arrivals'."""
    cols = ["spec", "temperature", "load", "metric", "real_gain", "sim_gain", "gap_points"]
    rows = []
    need = {"concurrency", "rate", "real_tpot_ms_mean", "sim_tpot_ms_mean", "sim_throughput_tok_s"}
    if not need <= set(table.columns):  # a table of errors only: no gains to take
        return pd.DataFrame(columns=cols)
    for (t, c, r), g in table.groupby(["temperature", "concurrency", "rate"], dropna=False):
        base = g[g["spec"] == "none"]
        if base.empty:
            continue
        b = base.iloc[0]
        closed = not np.isfinite(r)
        metric = "throughput" if closed else "tpot_speedup"
        for _, row in g[g["spec"] != "none"].iterrows():
            if closed:
                real = row["real_throughput_tok_s"] / b["real_throughput_tok_s"] - 1.0
                sim = row["sim_throughput_tok_s"] / b["sim_throughput_tok_s"] - 1.0
            else:
                real = b["real_tpot_ms_mean"] / row["real_tpot_ms_mean"] - 1.0
                sim = b["sim_tpot_ms_mean"] / row["sim_tpot_ms_mean"] - 1.0
            load = f"C={int(c)}" if closed else f"rate={r:g}"
            rows.append([row["spec"], t, load, metric, real, sim, 100.0 * (sim - real)])
    return pd.DataFrame(rows, columns=cols)


def accept_pooled(table: pd.DataFrame) -> pd.DataFrame:
    """Accepted per drafted token per (setting, temperature), pooled over every load: the
    server's counts against the trace's walk over the same requests. Why pooled: a cell's
    12-24 requests are few, and at T > 0 the server's outputs are samples of which the trace
    holds another (its batches change the logits), so a cell's gap is mostly that sample's."""
    need = ["real_accepted", "real_drafted", "sim_accepted", "sim_drafted"]
    t = table[table["real_drafted"] > 0] if set(need) <= set(table.columns) else table.iloc[:0]
    if not len(t):
        return pd.DataFrame(columns=["spec", "temperature", "real", "sim", "gap"])
    g = t.groupby(["spec", "temperature"])[need].sum().reset_index()
    g["real"] = g["real_accepted"] / g["real_drafted"]
    g["sim"] = g["sim_accepted"] / g["sim_drafted"]
    g["gap"] = g["sim"] / g["real"] - 1.0
    return g[["spec", "temperature", "real", "sim", "gap"]]


def summary_lines(table: pd.DataFrame) -> str:
    """The command's last line. A grid without a drafting setting (``--specs none``) has no
    accepted/drafted gap: said in words, never printed as ``nan%``."""
    g = goals(table)
    gap = g["accept_gap_max"]
    accept = (
        f"accepted/drafted gap max {100 * gap:.2f}%"
        if np.isfinite(gap)
        else "no accepted/drafted gap (no cell accepted drafts)"
    )
    return (
        f"{int(g['cells'])} cells: throughput |err| median {100 * g['throughput_median_abs']:.1f}%"
        f" max {100 * g['throughput_max_abs']:.1f}%; TPOT mean |err| median "
        f"{100 * g['tpot_mean_median_abs']:.1f}% max {100 * g['tpot_mean_max_abs']:.1f}%; "
        f"{accept}"
    )


def plot(table: pd.DataFrame, path: Path) -> Path:
    """Simulated against real (throughput, mean TPOT), one marker per setting, colour per
    temperature; and the error of every cell against its load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 5.2))
    markers = dict(zip(sorted(table["spec"].unique()), "osD^vP*X", strict=False))
    colours = {0.0: "#1f77b4", 1.0: "#d62728"}
    for ax, m, unit in ((axes[0], "throughput_tok_s", "tok/s"), (axes[1], "tpot_ms_mean", "ms")):
        for (spec, t), g in table.groupby(["spec", "temperature"]):
            ax.scatter(g[f"real_{m}"], g[f"sim_{m}"], marker=markers[spec], alpha=0.8, zorder=3,
                       color=colours.get(float(t), "k"), label=f"{spec}, T={t:g}")  # fmt: skip
        lo = float(np.nanmin(table[[f"real_{m}", f"sim_{m}"]].to_numpy()))
        hi = float(np.nanmax(table[[f"real_{m}", f"sim_{m}"]].to_numpy()))
        xs = np.array([lo * 0.95, hi * 1.05])
        ax.plot(xs, xs, "k-", lw=0.8, label="sim = real")
        ax.fill_between(xs, xs * 0.95, xs * 1.05, color="0.85", label="+-5%", zorder=0)
        ax.set_xlabel(f"llama-server, measured ({unit})")
        ax.set_ylabel(f"simulator, predicted ({unit})")
        ax.set_title("throughput" if m.startswith("throughput") else "mean TPOT")
    # the settings' legend below the panels: inside one it hid the points a miss sent there
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=6, fontsize=8, frameon=False)
    ax = axes[2]
    labels = _load_labels(table)
    order = list(dict.fromkeys(sorted(labels, key=_load_key)))
    x = np.array([order.index(v) for v in labels], dtype=np.float64)
    specs = sorted(table["spec"].unique())
    dodge = np.array([specs.index(v) for v in table["spec"]]) - (len(specs) - 1) / 2
    x = x + 0.12 * dodge
    for m, mk, lab in (("err_throughput_wall", "o", "throughput"),
                       ("err_tpot_mean_wall", "x", "mean TPOT")):  # fmt: skip
        ax.scatter(x, 100 * table[m], marker=mk, label=lab, alpha=0.7, zorder=3)
    ax.set_xticks(range(len(order)), order)
    ax.axhspan(-5, 5, color="0.85", label="+-5%", zorder=0)  # under the markers
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xlabel("load: closed loop at C, or Poisson rate (settings side by side)")
    ax.set_ylabel("simulator error (%) = sim / real - 1")
    ax.set_title("error per cell")
    ax.legend(fontsize=8)
    rows = -(-len(names) // 6)  # the legend's rows, under the panels
    fig.tight_layout(rect=(0.0, 0.045 * rows, 1.0, 1.0))
    from specsim.outputs import atomic

    with atomic(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return path


def _load_labels(table: pd.DataFrame) -> list[str]:
    return [f"C={int(c)}" if pd.notna(c) else f"{r:g} req/s"
            for c, r in zip(table["concurrency"], table["rate"], strict=True)]  # fmt: skip


def _load_key(label: str) -> tuple[int, float]:
    """Closed loops first by C, then open loops by rate."""
    if label.startswith("C="):
        return (0, float(label[2:]))
    return (1, float(label.split()[0]))


def _fmt_cells(table: pd.DataFrame) -> str:
    cols = ["spec", "temperature", "concurrency", "rate", "real_throughput_tok_s",
            "sim_throughput_tok_s", "err_throughput_wall", "real_tpot_ms_mean",
            "sim_tpot_ms_mean", "err_tpot_mean_wall", "spread_real",
            "real_accept_per_draft", "sim_accept_per_draft"]  # fmt: skip
    # the real medians' intervals (fidelity.csv from --target-ci on; older tables lack them)
    cols += [c for c in ("repeats", "ci_throughput", "ci_tpot_mean", "converged")
             if c in table.columns]  # fmt: skip
    t = table[cols].copy()
    head = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
    lines = []
    for _, r in t.iterrows():
        vals = []
        for c in cols:
            v = r[c]
            if isinstance(v, float) and c.startswith(("err", "spread", "ci_")):
                vals.append(f"{100 * v:+.1f}%" if c.startswith("err") else f"{100 * v:.1f}%")
            elif isinstance(v, float) and np.isnan(v):
                vals.append("")
            elif isinstance(v, float):
                vals.append(f"{v:.3g}" if "accept" in c or c in ("temperature", "rate")
                            else f"{v:.1f}")  # fmt: skip
            else:
                vals.append(str(v))
        lines.append("| " + " | ".join(vals) + " |")
    return head + "\n".join(lines) + "\n"


def wide_cells(table: pd.DataFrame) -> str:
    """The cells whose real interval stayed wider than the tolerance (listed, never dropped:
    the issue's goals are judged on the others), one line; empty without intervals."""
    if "converged" not in table.columns:
        return ""
    wide = table[~table["converged"].astype(bool)]
    if not len(wide):
        return "Every cell's real interval is within the tolerance."
    names = [f"{r.spec} T={r.temperature:g} " + _load_labels(wide.loc[[i]])[0]
             for i, r in wide.iterrows()]  # fmt: skip
    return (
        f"{len(wide)} cells with a real interval wider than the tolerance: "
        + "; ".join(names)
        + "."
    )


def write_report(
    cfg: LlamaValidationConfig,
    table: pd.DataFrame,
    ranks: pd.DataFrame,
    minutes: float,
    load: tuple,
    rescored: bool = False,
    command: str = "",
    drift: tuple[pd.DataFrame, pd.DataFrame] | None = None,
) -> Path:
    """``README.md`` and ``fidelity.png`` in ``cfg.out`` (the words are in
    :mod:`specsim.fidelity.llama.report_text`); ``drift``: the probes and the table scored at
    each run's speed (``--drift-probe``), a section of their own."""
    from specsim.fidelity.llama.report_text import render
    from specsim.outputs import write_text

    plot(table, cfg.out / "fidelity.png")
    gain = gains(table)
    if len(gain):
        from specsim.outputs import write_table

        write_table(gain, cfg.out / "gains.csv")
    g = goals(table)
    machine = f"{cpu_model()} ({os.cpu_count()} cores), Python {sys.version.split()[0]}"
    text = render(cfg, g, ranks, _fmt_cells(table), minutes, load, machine, rescored, command)
    if drift is not None:
        from specsim.fidelity.llama.drift import section

        text += section(drift[0], goals(drift[1]))
    if "paired_tight" in table.columns:  # --arrival-seeds per-run: each run against its own
        from specsim.fidelity.llama.grid import DEFAULT_TOL
        from specsim.fidelity.llama.paired import section as paired_section

        tol = cfg.target_ci if cfg.target_ci is not None else DEFAULT_TOL
        text += paired_section(table, tol)
    wide = wide_cells(table)
    if wide:
        text += "\n## Real intervals (repeat rule: docs/fidelity.md)\n\n" + wide + "\n"
    notes = cfg.out / "NOTES.md"  # what a person wrote about a run: kept through --rescore
    if notes.exists():
        text += "\n" + notes.read_text()
    return write_text(text, cfg.out / "README.md")


def cpu_model() -> str:
    """The CPU's model name as ``lscpu`` prints it (``/proc/cpuinfo``), else the platform's."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
