"""Figures from sweep tables and traces, each drawn on a matplotlib Axes a caller may pass.

Every figure: units in axis labels, a legend, one policy one style (:mod:`palette`) whatever
else is plotted. The ``plot_*`` functions draw one panel and are what a notebook calls;
``figure(kind, ...)`` in :mod:`specsim.analysis.figures` lays a whole Figure out on a page (one
panel per trace) for the CLI and reports.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pandas as pd

from specsim.analysis.frontier import X, Y, curves, throughput_at_sla
from specsim.analysis.palette import policy_label, policy_style
from specsim.errors import SpecsimError

KINDS = ("pareto", "sla", "load", "calibration")
LOAD_LABEL = {"concurrency": "load: concurrent requests", "rate": "load: arrival rate (req/s)"}


def layered(i: int, n: int, base_lw: float = 1.3, base_ms: float = 4.0) -> dict[str, float]:
    """Line width, marker size and z-order of the i-th of n series drawn on one axes.

    Policies often coincide (``zos`` and ``fresh-overlapped`` at low scheduler cost, every
    policy's TTFT p99 when queueing dominates): drawn alike, the last one hides the others and a
    legend of five shows three lines. Earlier series are drawn wider and underneath, later ones
    thinner on top, so a coincident series stays visible as a halo around the one above it.
    """
    share = (n - 1 - i) / max(n - 1, 1)
    return {"linewidth": base_lw + 2.4 * share, "markersize": base_ms + 3.5 * share,
            "zorder": 2 + i}  # fmt: skip


def _plt():
    import matplotlib

    if "matplotlib.pyplot" not in __import__("sys").modules:
        matplotlib.use(os.environ.get("MPLBACKEND", "Agg"))
    import matplotlib.pyplot as plt

    return plt


def _policies(table: pd.DataFrame) -> list[str]:
    """Policies in the one order every figure uses (``palette.policy_order``)."""
    from specsim.analysis.palette import policy_order

    return policy_order(list(table["policy"].astype(str)))


def _one_trace(table: pd.DataFrame, trace: str | None) -> pd.DataFrame:
    if "trace" not in table.columns:
        return table
    names = list(dict.fromkeys(table["trace"].astype(str)))
    if trace is None:
        if len(names) > 1:
            raise SpecsimError(
                f"the table holds several traces ({', '.join(names)}); pick one with trace="
            )
        return table
    if trace not in names:
        raise SpecsimError(f"trace {trace!r} is not in the table; it has {', '.join(names)}")
    return table[table["trace"].astype(str) == trace]


def _load_kind(table: pd.DataFrame) -> str:
    kinds = set(table["load_kind"]) if "load_kind" in table.columns else {"concurrency"}
    if len(kinds) != 1:
        raise SpecsimError("the table mixes concurrency and rate sweeps; plot them separately")
    return kinds.pop()


def plot_pareto(table: pd.DataFrame, ax: Any = None, *, trace: str | None = None) -> Any:
    """Throughput per GPU (tok/s) against per-user decode speed (tok/s/user), one curve per
    policy across load (mean over seeds); the lowest and highest load are annotated."""
    plt = _plt()
    own = ax is None
    ax = ax if ax is not None else plt.subplots(figsize=(8.2, 4.6))[1]
    data = _one_trace(table, trace)
    cur = curves(data, by=("policy",))
    kind = _load_kind(data)
    pols = _policies(data)
    for i, pol in enumerate(pols):
        c = cur[cur["policy"] == pol].sort_values("load")
        ax.plot(
            c[X],
            c[Y],
            label=policy_label(pol),
            **layered(i, len(pols)),
            **policy_style(pol).kwargs(),
        )
    if len(cur):
        lo, hi = cur["load"].min(), cur["load"].max()
        unit = "" if kind == "concurrency" else " req/s"
        ax.text(
            0.99,
            0.01,
            f"points: load {lo:g} to {hi:g}{unit} (more load: right to left)",
            transform=ax.transAxes,
            ha="right",
            va="bottom",
            fontsize=7,
            color="#555555",
        )
    ax.set_xlabel("per-user decode speed (tok/s/user)")
    ax.set_ylabel("throughput per GPU (tok/s)")
    ax.grid(True, alpha=0.3)
    # beside the panel, never over the curves (the frontier's corner is where legends land)
    ax.legend(title="policy", fontsize=8, title_fontsize=8, loc="upper left",
              bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)  # fmt: skip
    if own:
        ax.figure.tight_layout()
    return ax


BAR_FONT = 7.5  # bar labels: legible at a page's width (6 pt was too small to read)


def plot_sla(
    table: pd.DataFrame,
    targets: list[float],
    ax: Any = None,
    *,
    baseline: str | None = "mtp1",
    trace: str | None = None,
) -> Any:
    """Bars: throughput at each SLA target (tok/s/user) per policy, labelled with the tok/s
    and the % gain over ``baseline``. Out-of-reach SLAs are marked 'n/a' (no bar)."""
    plt = _plt()
    ax = ax if ax is not None else plt.subplots(figsize=(7.2, 4.6))[1]
    data = _one_trace(table, trace)
    sla = throughput_at_sla(data, targets, baseline=baseline, by=())
    pols = _policies(data)
    n = len(pols)
    width = 0.8 / max(n, 1)
    xs = np.arange(len(targets), dtype=float)
    top = (
        np.nanmax(sla["throughput_per_gpu_tok_s"].to_numpy())
        if sla["throughput_per_gpu_tok_s"].notna().any()
        else 1.0
    )
    for i, pol in enumerate(pols):
        s = sla[sla["policy"] == pol].set_index("sla_tps").reindex([float(t) for t in targets])
        vals = s["throughput_per_gpu_tok_s"].to_numpy()
        pos = xs - 0.4 + width * (i + 0.5)
        st = policy_style(pol)
        ax.bar(
            pos,
            np.nan_to_num(vals),
            width * 0.92,
            color=st.color,
            hatch=st.hatch,
            label=policy_label(pol),
            edgecolor="white",
            linewidth=0.5,
        )
        gains = s["gain_pct"] if "gain_pct" in s else pd.Series(np.nan, index=s.index)
        for p, v, g in zip(pos, vals, gains, strict=True):
            if not np.isfinite(v):
                ax.text(p, top * 0.01, "n/a", ha="center", va="bottom", fontsize=BAR_FONT,
                        rotation=90)  # fmt: skip
                continue
            label = f"{v:,.0f}"
            if baseline is not None and pol != baseline:
                label += f" ({g:+.0f}%)" if np.isfinite(g) else f" ({baseline} cannot)"
            ax.text(p, v + top * 0.01, label, ha="center", va="bottom", fontsize=BAR_FONT,
                    rotation=90)  # fmt: skip
    ax.set_xticks(xs, [f"{t:g}" for t in targets])
    ax.set_xlabel("SLA: per-user decode speed at least (tok/s/user)")
    ax.set_ylabel("throughput per GPU at the SLA (tok/s)")
    ax.set_ylim(0, top * 1.55)  # room above the tallest bar for its label
    ax.grid(True, axis="y", alpha=0.3)
    title = "policy" if baseline is None else f"policy (gain vs {baseline})"
    ax.legend(
        title=title, fontsize=8, title_fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0)
    )  # outside: the bar labels need the space above the bars
    return ax


LOAD_METRICS = (
    # (p50 column, p99 column, panel title, y label, log y)
    ("tau", None, "acceptance length tau", "tokens per request-step (tok)", False),
    (
        "verify_efficiency",
        None,
        "verify efficiency",
        "accepted / verified drafts (share)",
        False,
    ),
    ("ttft_ms_p50", "ttft_ms_p99", "time to first token", "TTFT (ms)", True),
    # log y: TPOT spans 10x from 1 to 256 users, and on a linear axis the low loads collapse
    ("tpot_ms_p50", "tpot_ms_p99", "time per output token", "TPOT (ms)", True),
)


def plot_load(table: pd.DataFrame, axes: Any = None, *, trace: str | None = None) -> Any:
    """Four panels against load: tau, verify efficiency (accepted / verified draft tokens),
    TTFT p50/p99, TPOT p50/p99. Solid lines are p50, thin dashed lines p99 (mean over seeds).
    ``ar`` verifies no drafts, so it has no verify efficiency."""
    plt = _plt()
    from matplotlib.lines import Line2D
    from matplotlib.ticker import FixedLocator, NullLocator

    if axes is None:
        axes = plt.subplots(2, 2, figsize=(10, 7))[1]
    axes = np.asarray(axes).ravel()
    if axes.size != 4:
        raise SpecsimError("plot_load draws 4 panels; pass 4 axes (e.g. plt.subplots(2, 2)[1])")
    data = _one_trace(table, trace)
    kind = _load_kind(data)
    cur = curves(data, by=("policy",))
    loads = np.sort(cur["load"].unique())
    pols = _policies(data)
    for ax, (m50, m99, title, label, logy) in zip(axes, LOAD_METRICS, strict=True):
        for i, pol in enumerate(pols):
            c = cur[cur["policy"] == pol].sort_values("load")
            st = policy_style(pol)
            lay = layered(i, len(pols), base_lw=1.1, base_ms=3.0)
            if m50 in c.columns:
                ax.plot(c["load"], c[m50], label=policy_label(pol), **lay, **st.kwargs())
            if m99 is not None and m99 in c.columns:  # p99: same colour and marker, hollow
                ax.plot(c["load"], c[m99], color=st.color, marker=st.marker, linestyle="--",
                        linewidth=lay["linewidth"] * 0.6, markersize=lay["markersize"],
                        markerfacecolor="none", zorder=lay["zorder"], alpha=0.9)  # fmt: skip
        if loads.size and loads.min() > 0 and loads.max() / loads.min() >= 8:  # spans octaves
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(FixedLocator(loads))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticklabels([f"{x:g}" for x in loads])
        if logy:  # ticks at 1, 2, 5 x 10^n written as plain numbers (ms), not 10^n alone
            from matplotlib.ticker import LogLocator, NullFormatter, StrMethodFormatter

            ax.set_yscale("log")
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_title(title, fontsize=10)
        ax.set_ylabel(label)
        ax.set_xlabel(LOAD_LABEL[kind])
        ax.grid(True, alpha=0.3)
    axes[1].legend(title="policy", fontsize=7, title_fontsize=7, loc="upper left",
                   bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)  # fmt: skip
    axes[2].legend(
        [
            Line2D([], [], color="k", marker="o"),
            Line2D(
                [], [], color="k", marker="o", linestyle="--", linewidth=0.8, markerfacecolor="none"
            ),
        ],
        ["p50 (filled)", "p99 (hollow, dashed)"],
        fontsize=7,
        title="percentile",
        title_fontsize=7,
    )
    return axes


def reliability(scores: np.ndarray, labels: np.ndarray, n_bins: int = 10) -> pd.DataFrame:
    """Equal-width bins of predicted probability: mean prediction, observed rate, count."""
    from specsim.trace.stats import calibration_bins

    cnt, s, lab = calibration_bins(scores, labels, n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        return pd.DataFrame(
            {"bin": np.arange(n_bins), "predicted": s / cnt, "observed": lab / cnt, "count": cnt}
        )


def calibration_table(trace: Any, holdout: float = 0.3, seed: int = 0) -> pd.DataFrame:
    """ECE of the survival a_k per position k, raw and after STS, scored on the requests STS
    was NOT fitted on. Columns: position, ece_raw, ece_sts, temperature, rows."""
    from specsim.policies.calibrate import apply_sts, ece_many, fit_sts, split_requests

    fit_idx, rest_idx = split_requests(trace.n_requests, holdout, seed)
    fit, rest = trace.select(fit_idx), trace.select(rest_idx)
    temps = fit_sts(fit.conf, fit.accept_len)
    raw = rest.survival()
    cal = np.cumprod(apply_sts(rest.conf, temps).astype(np.float64), axis=1)
    rows = []
    for k in range(trace.block_size):
        lab = (rest.accept_len >= k + 1).astype(np.float64)
        e = ece_many(np.stack([raw[:, k], cal[:, k]]), lab)
        rows.append(
            {
                "position": k + 1,
                "ece_raw": float(e[0]),
                "ece_sts": float(e[1]),
                "temperature": float(temps[k]),
                "rows": int(lab.size),
            }
        )
    return pd.DataFrame(rows)


def plot_calibration(
    trace: Any,
    axes: Any = None,
    *,
    holdout: float = 0.3,
    seed: int = 0,
    n_bins: int = 10,
    min_count: int = 20,
) -> Any:
    """Reliability diagram of the survival a_k per position k: raw confidences (left) and
    after STS (right), both scored on held-out requests; ECE per position in the legends.
    Bins holding fewer than ``min_count`` rows are not drawn (noise)."""
    plt = _plt()
    from specsim.policies.calibrate import apply_sts, fit_sts, split_requests

    if axes is None:
        axes = plt.subplots(1, 2, figsize=(10, 4.6), sharey=True)[1]
    axes = np.asarray(axes).ravel()
    if axes.size != 2:
        raise SpecsimError("plot_calibration draws 2 panels; pass 2 axes")
    fit_idx, rest_idx = split_requests(trace.n_requests, holdout, seed)
    fit, rest = trace.select(fit_idx), trace.select(rest_idx)
    temps = fit_sts(fit.conf, fit.accept_len)
    surv = {
        "raw confidences": rest.survival(),
        "after STS": np.cumprod(apply_sts(rest.conf, temps).astype(np.float64), axis=1),
    }
    table = calibration_table(trace, holdout, seed)
    cmap = plt.get_cmap("viridis")
    gamma = trace.block_size
    for ax, (title, a), col in zip(axes, surv.items(), ("ece_raw", "ece_sts"), strict=True):
        ax.plot([0, 1], [0, 1], color="#999999", linestyle=":", linewidth=1, label="perfect")
        for k in range(gamma):
            lab = rest.accept_len >= k + 1
            rel = reliability(a[:, k], lab, n_bins)
            rel = rel[rel["count"] >= min_count]
            ece = table.loc[k, col]
            ax.plot(
                rel["predicted"],
                rel["observed"],
                marker="o",
                markersize=3,
                linewidth=1.2,
                color=cmap(k / max(gamma - 1, 1) * 0.9),
                label=f"a_{k + 1}: ECE {100 * ece:.1f}%",
            )
        mean_ece = 100 * table[col].mean()
        ax.set_title(f"{title} (mean ECE {mean_ece:.1f}%)", fontsize=10)
        ax.set_xlabel("predicted survival a_k (probability)")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_aspect("equal")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, title="position", title_fontsize=7, loc="upper left")
    axes[0].set_ylabel("observed: first k drafts accepted (share)")
    return axes
