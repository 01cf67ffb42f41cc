"""The fidelity report's page and figures, from the tables ``specsim validate`` writes.

Kept apart from :mod:`specsim.analysis.validate` (which runs the grid) so that the page can be
re-rendered from committed CSVs without torch: ``render(out_dir, command)``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from specsim.analysis.validate import GOAL, MEDIAN_GOAL

PANELS = (
    ("throughput_tok_s", "throughput (tok/s)"),
    ("tpot_ms_mean", "mean TPOT (ms)"),
    ("tpot_ms_p90", "p90 TPOT (ms)"),
    ("ttft_ms_p50", "p50 TTFT (ms)"),
)


def goal_summary(table: pd.DataFrame, prefix: str = "") -> dict[str, float]:
    """How many cells meet each goal (on the clock whose columns start with ``prefix``)."""
    out: dict[str, float] = {"cells": float(len(table))}
    for m, g in GOAL.items():
        e = table[f"{prefix}err_{m}"].abs()
        out[f"within_{m}"] = float((e <= g).sum())
        out[f"max_{m}"] = float(e.max())
        out[f"median_{m}"] = float(e.median())
    both = (table[f"{prefix}err_throughput_tok_s"].abs() <= GOAL["throughput_tok_s"]) & (
        table[f"{prefix}err_tpot_ms_mean"].abs() <= GOAL["tpot_ms_mean"]
    )
    out["within_both"] = float(both.sum())
    return out


def within_spread(table: pd.DataFrame) -> pd.Series:
    """Whether the simulator's throughput and mean TPOT errors are both smaller than the real
    engine's own run-to-run spread (max - min over repeats, relative to the mean)."""
    return (table["err_throughput_tok_s"].abs() <= table["spread_throughput_tok_s"]) & (
        table["err_tpot_ms_mean"].abs() <= table["spread_tpot_ms_mean"]
    )


def machine_verdict(table: pd.DataFrame, goal: float = GOAL["throughput_tok_s"]) -> str:
    """Whether the real engine repeated itself well enough on this machine for the grid to
    test a ``goal``-sized error. The simulator cannot be shown to be within 5% of an engine
    whose own repeats differ by 20%: when the median repeat spread (closed-loop cells with
    two or more runs, throughput and mean TPOT) is above ``goal``, say so, so that nobody
    reads a noisy host's grid as the simulator's error. Empty without repeats."""
    cols = ["spread_throughput_tok_s", "spread_tpot_ms_mean"]
    rep = table[(table["concurrency"] > 0) & (table["repeats"] > 1)].dropna(subset=cols)
    if rep.empty:
        return ""
    spread = rep[cols].max(axis=1)
    med, worst = float(spread.median()), float(spread.max())
    head = (
        f"**Could this machine test the goal?** The real engine's own repeats (same cell, same "
        f"seeded jobs, throughput or mean TPOT, max - min over mean) differ by a median "
        f"{100 * med:.1f}% (worst {100 * worst:.1f}%) over {len(rep)} closed-loop cells"
    )
    if med <= goal:
        return head + (
            f": below the {100 * goal:.0f}% goal, so the grid can test it (an error below a "
            "cell's own spread is still within the machine's noise)."
        )
    return (
        head + f": MORE than the {100 * goal:.0f}% goal. On this run the machine's speed moved "
        "more than the errors the grid is after, so it cannot show whether the simulator meets "
        "the goal; the errors above are mostly the machine's. Rerun on a quieter host; with "
        "`--clock ref`, keep `--ref-every 1 --ref-window 1` (docs/fidelity.md)."
    )


def _pct(x: float) -> str:
    return "n/a" if not np.isfinite(x) else f"{100 * x:+.1f}%"


def cell_markdown(table: pd.DataFrame, clock: str) -> str:
    head = (
        "| drafter | policy | load | jobs x repeats | throughput real / sim (tok/s) | err | "
        "spread | mean TPOT real / sim (ms) | err | spread | p90 TPOT err | p50 TTFT err | "
        "tau real / sim | within spread | wall clock: err throughput / TPOT | probe slowdown "
        "| speed-adjusted err throughput / TPOT | speed factor |"
    )
    lines = [head, "|" + "---|" * 18]
    sp = within_spread(table)
    for (_, r), ok in zip(table.iterrows(), sp, strict=True):
        wall = (
            f"{_pct(r.wall_err_throughput_tok_s)} / {_pct(r.wall_err_tpot_ms_mean)}"
            if "wall_err_throughput_tok_s" in r and np.isfinite(r.wall_err_throughput_tok_s)
            else "(open loop: run's clock only)"
        )
        lines.append(
            f"| {r.drafter} | {r.policy} | {r.load} | {r.jobs} x {r.repeats} | "
            f"{r.real_throughput_tok_s:.2f} / {r.sim_throughput_tok_s:.2f} | "
            f"{_pct(r.err_throughput_tok_s)} | {100 * r.spread_throughput_tok_s:.1f}% | "
            f"{r.real_tpot_ms_mean:.1f} / {r.sim_tpot_ms_mean:.1f} | {_pct(r.err_tpot_ms_mean)} | "
            f"{100 * r.spread_tpot_ms_mean:.1f}% | {_pct(r.err_tpot_ms_p90)} | "
            f"{_pct(r.err_ttft_ms_p50)} | {r.real_tau:.2f} / {r.sim_tau:.2f} | "
            f"{'yes' if ok else 'no'} | {wall} | {r.slowdown_vs_profile:.3f} | "
            f"{_pct(r.adj_err_throughput_tok_s)} / {_pct(r.adj_err_tpot_ms_mean)} | "
            f"{getattr(r, 'speed_factor', float('nan')):.3f} |"
        )
    return "\n".join(lines)


def misses_markdown(table: pd.DataFrame, decomposition: Path) -> str:
    """The cells outside the 5% goal (throughput or mean TPOT) and, from the per-step
    decomposition of their first run, which term differs: drafting (real against the draft
    terms) or verification (the target forward plus the loop, real against the table plus the
    overhead curve; apart they cannot be compared, the per-request attention the curve charges
    runs inside the real forward). Empty when every cell meets the goal."""
    bad = table[
        (table["err_throughput_tok_s"].abs() > GOAL["throughput_tok_s"])
        | (table["err_tpot_ms_mean"].abs() > GOAL["tpot_ms_mean"])
    ]
    if bad.empty:
        return ""
    dec = pd.read_csv(decomposition) if decomposition.exists() else pd.DataFrame()
    lines = [
        "## Cells outside the goal, and the term that differs",
        "",
        "Mean ms per decode-only step of the cell's first run (decomposition.csv): drafting "
        "real / model, verification (forward + loop) real / (table + overhead), and the term "
        "with the larger gap. A gap smaller than the error says the rest is in the steps the "
        "decomposition leaves out (prefill steps, mixed steps) or in the run-to-run spread.",
        "",
        "| drafter | policy | load | err throughput / TPOT | spread | draft real / model | "
        "verify real / model | step real / model | term that differs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in bad.iterrows():
        d = (
            dec[(dec.drafter == r.drafter) & (dec.policy == r.policy) & (dec.load == r.load)]
            if not dec.empty
            else dec
        )
        if d.empty or not np.isfinite(d["real_step_ms"].iloc[0]):
            cols = "n/a | n/a | n/a | (no decode-only steps)"
        else:
            x = d.iloc[0]
            dv = x.real_forward_ms + x.real_loop_ms
            mv = x.model_table_ms + x.model_overhead_ms
            g_d, g_v = x.real_draft_ms - x.model_draft_ms, dv - mv
            name = "drafting" if abs(g_d) >= abs(g_v) else "verification"
            gap = g_d if name == "drafting" else g_v
            cols = (
                f"{x.real_draft_ms:.1f} / {x.model_draft_ms:.1f} | {dv:.1f} / {mv:.1f} | "
                f"{x.real_step_ms:.1f} / {x.model_step_ms:.1f} | {name}: real {gap:+.1f} ms "
                f"({100 * gap / x.real_step_ms:+.1f}% of the step)"
            )
        lines.append(
            f"| {r.drafter} | {r.policy} | {r.load} | {_pct(r.err_throughput_tok_s)} / "
            f"{_pct(r.err_tpot_ms_mean)} | {100 * r.spread_throughput_tok_s:.1f}% | {cols} |"
        )
    return "\n".join(lines)


def ttft_parts(requests: pd.DataFrame) -> dict[str, float]:
    """Medians over a cell's requests (every repeat pooled) of its TTFT and of the two parts it
    is made of: queued (arrival to admission: waiting for a slot, for the KV budget, or for the
    running step to end) and prefill (admission to the first token: the prefill step or
    steps, shared with whatever else that step computed), in ms."""
    wait = 1000.0 * (requests["admitted_s"] - requests["arrival_s"])
    pre = 1000.0 * (requests["first_token_s"] - requests["admitted_s"])
    return {
        "n": float(len(requests)),
        "ttft_ms": float(requests["ttft_ms"].median()),
        "queued_ms": float(wait.median()),
        "prefill_ms": float(pre.median()),
    }


def ttft_misses_markdown(table: pd.DataFrame, requests: Path) -> str:
    """The cells whose p50 TTFT misses its goal and, from every request's timeline
    (``requests.parquet``: real runs and the simulation), which part differs: the time queued
    or the prefill. Empty when every cell meets the goal or the grid kept no timelines (v7 and
    before)."""
    bad = table[table["err_ttft_ms_p50"].abs() > GOAL["ttft_ms_p50"]]
    if bad.empty or not requests.exists():
        return ""
    req = pd.read_parquet(requests)
    lines = [
        "## Cells outside the TTFT goal, and the part that differs",
        "",
        "Medians over the cell's requests (real: every repeat pooled), in ms: TTFT, the time "
        "queued (arrival to admission: a slot, the KV budget, or the running step's end) and "
        "the prefill (admission to the first token). The part with the larger gap is named "
        "with its share of the real TTFT. p50 TTFT is the median of few requests (jobs x "
        "repeats), each one prefill forward timed at one reading of the speed probes, or one "
        "request arriving just before or after a step boundary: spread is the real p50 TTFT's "
        "max - min over mean across the repeats, and an error inside it is the real engine's "
        "own noise.",
        "",
        "| drafter | policy | load | requests real / sim | p50 TTFT err | spread | "
        "TTFT real / sim | queued real / sim | prefill real / sim | part that differs |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    inside = 0
    for _, r in bad.iterrows():
        cell = req[(req.drafter == r.drafter) & (req.policy == r.policy) & (req.load == r.load)]
        real, sim = cell[cell.side == "real"], cell[cell.side == "sim"]
        if real.empty or sim.empty:
            continue
        a, b = ttft_parts(real), ttft_parts(sim)
        g_q, g_p = b["queued_ms"] - a["queued_ms"], b["prefill_ms"] - a["prefill_ms"]
        name, gap = ("queued", g_q) if abs(g_q) >= abs(g_p) else ("prefill", g_p)
        spread = float(getattr(r, "spread_ttft_ms_p50", float("nan")))
        within = np.isfinite(spread) and abs(r.err_ttft_ms_p50) <= spread
        inside += int(within)
        lines.append(
            f"| {r.drafter} | {r.policy} | {r.load} | {a['n']:.0f} / {b['n']:.0f} | "
            f"{_pct(r.err_ttft_ms_p50)} | "
            + (
                f"{100 * spread:.1f}%{' (inside)' if within else ''}"
                if np.isfinite(spread)
                else "n/a"
            )
            + f" | {a['ttft_ms']:.1f} / {b['ttft_ms']:.1f} | "
            f"{a['queued_ms']:.1f} / {b['queued_ms']:.1f} | "
            f"{a['prefill_ms']:.1f} / {b['prefill_ms']:.1f} | {name}: sim {gap:+.1f} ms "
            f"({100 * gap / max(a['ttft_ms'], 1e-9):+.1f}% of the real TTFT) |"
        )
    lines += [
        "",
        f"{inside} of these {len(bad)} misses are inside the real p50 TTFT's own spread across "
        "the repeats.",
    ]
    return "\n".join(lines)


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
    bins = np.linspace(-0.2, 0.2, 41)
    for m, label in PANELS:
        e = table[f"err_{m}"].to_numpy(np.float64)
        e = np.clip(e[np.isfinite(e)], -0.2, 0.2)
        hist_ax.hist(e, bins=bins, histtype="step", lw=1.6, label=label.split(" (")[0])
    for x in (-0.05, 0.05):
        hist_ax.axvline(x, color="0.5", ls=":", lw=1)
    hist_ax.set_xlabel("relative error (sim - real) / real (clipped at +-20%)")
    hist_ax.set_ylabel("cells")
    hist_ax.set_title("raw error histogram, all cells (dotted: +-5%)")
    hist_ax.legend(fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    from specsim.outputs import atomic

    with atomic(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return path


def _draft_plus(cost, base_ms: float, per_request_ms: float, linear: bool = False) -> dict:  # type: ignore[no-untyped-def]
    """Profile fields that add ``base_ms + per_request_ms R`` to drafting: on the measured draft
    curve when there is one (and ``linear`` is False), else on its straight line."""
    if cost.draft_curve and not linear:
        return {
            "draft_curve": tuple((r, m + base_ms + per_request_ms * r) for r, m in cost.draft_curve)
        }
    return {
        "draft_curve": (),
        "draft_base_ms": cost.draft_base_ms + base_ms,
        "draft_per_request_ms": cost.draft_per_request_ms + per_request_ms,
    }


def term_variants(cost):  # type: ignore[no-untyped-def]
    """The measured profile without each engine term, the term folded back the way the v1
    cost model charged it: what each term buys is the error it removes. A measured overhead
    curve is also scored against the forms it replaced (the step's residual at each R, with
    the engine's drafting and with v3's modelled one, and v2's line), and a measured draft
    curve against the straight line it replaced."""
    from dataclasses import replace

    from specsim.sim.profiles import parse_curve

    dctx = float(cost.meta.get("draft_context", 128))
    win = cost.draft_context_window or dctx
    ctx_ms = cost.draft_per_context_us * 1e-3 * min(dctx, win)
    base, slope = cost.step_overhead_ms, cost.verify_per_request_ms
    fit = cost.meta.get("overhead_linear_fit", "")  # the v2 line through the residual: "a + b R"
    if cost.overhead_curve and fit:
        a, _, b = fit.partition("+")
        base, slope = float(a), float(b.replace("R", ""))
    elif cost.overhead_curve:
        rr, mm = np.array(cost.overhead_curve, dtype=np.float64).T
        slope, base = np.polyfit(rr, mm, 1) if rr.size > 1 else (0.0, mm[0])
        base, slope = max(float(base), 0.0), max(float(slope), 0.0)
    no_pre = {"prefill_token_ms": 0.0}
    no_ctx = {"draft_per_context_us": 0.0, **_draft_plus(cost, 0.0, ctx_ms)}
    no_over = {"overhead_curve": (), "verify_per_request_ms": 0.0, "step_overhead_ms": 0.0}
    no_req = {**no_over, **_draft_plus(cost, base, slope)}
    v1 = {**no_pre, **no_over, "draft_per_context_us": 0.0}
    v1.update(_draft_plus(cost, base, ctx_ms + slope, linear=True))
    out = {"full model": cost}
    if cost.draft_curve:
        out["drafting as a straight line (v3: draft_base + draft_per_request R)"] = replace(
            cost, draft_curve=()
        )
    if cost.overhead_curve:
        for key, label in (
            ("overhead_engine_curve", "loop overhead as the engine's step residual at each R "
             "(step - engine drafting - table)"),
            ("overhead_residual_curve", "loop overhead as the residual at each R (step - "
             "modelled draft - table)"),
        ):  # fmt: skip
            if cost.meta.get(key, ""):
                out[label] = replace(cost, overhead_curve=parse_curve(cost.meta[key], cost.name))
        if cost.accept_per_token_ms and cost.meta.get("overhead_k4_curve", ""):
            out["loop per request only, at 4 tokens a request (v5: no per-token term)"] = replace(
                cost,
                accept_per_token_ms=0.0,
                overhead_curve=parse_curve(cost.meta["overhead_k4_curve"], cost.name),
            )
        out["loop overhead as a straight line (v2: step_overhead + verify_per_request R)"] = (
            replace(cost, overhead_curve=(), step_overhead_ms=base, verify_per_request_ms=slope)
        )
    out.update(
        {
            "without the prefill-token term (prompts through the table)": replace(cost, **no_pre),
            "without the draft-context term (at the typical context)": replace(cost, **no_ctx),
            "without the loop-overhead terms (v1: per decoding request, in drafting)": replace(
                cost, **no_req
            ),
            "v1 model (none of the three)": replace(cost, **v1),
        }
    )
    return out


def replay_cell(trace: Any, cell: Any, cfg: dict, cost: Any) -> dict[str, float]:
    """The simulated side of one row of a report's ``fidelity.csv`` (``cell``: its
    itertuple) under ``cost``: the same jobs, seed, load and policy as the grid replayed."""
    from specsim.analysis.validate import cell_metrics
    from specsim.sim.simulate import replay

    kw = {"requests": int(cell.jobs), "seed": int(cfg.get("seed", 0)), "record_tokens": False}
    if cell.concurrency > 0:
        kw["concurrency"] = int(cell.concurrency)
    else:
        kw["rate"] = float(cfg.get("rates_req_s", {})[f"{cell.drafter} {cell.policy} {cell.load}"])
    res = replay(trace, cell.policy, profile=cost, **kw)
    return cell_metrics(res.summary, res.requests)


def term_ablation(out_dir: Path) -> pd.DataFrame:
    """Replays every cell of a finished grid with each term removed (torch-free, seconds) and
    scores it against the same real runs: ``terms.csv``."""
    df = score_variants(out_dir, lambda drafter, cost: term_variants(cost))
    from specsim.outputs import atomic

    with atomic(out_dir / "terms.csv") as tmp:
        df.to_csv(tmp, index=False, float_format="%.6g")
    return df


def score_variants(out_dir: Path, variants) -> pd.DataFrame:  # type: ignore[no-untyped-def]
    """Every cell of a finished grid replayed under each cost model that ``variants(drafter,
    measured profile)`` returns ({name: CostModel}), scored against the same real runs: one
    row per (variant, cell) with its relative errors (torch-free)."""
    from specsim.sim.profiles import read_profile_csv
    from specsim.trace.io import read_trace

    table = pd.read_csv(out_dir / "fidelity.csv")
    cfg = json.loads((out_dir / "config.json").read_text())
    rows = []
    for drafter, grp in table.groupby("drafter", sort=False):
        trace = read_trace(cfg["traces"][drafter])
        cost = read_profile_csv(out_dir / f"profile-{str(drafter).replace(':', '')}.csv")
        for name, variant in variants(str(drafter), cost).items():
            for r in grp.itertuples():
                m = replay_cell(trace, r, cfg, variant)
                slow = float(getattr(r, "slowdown_vs_profile", 1.0))
                slow = slow if np.isfinite(slow) else 1.0
                rows.append(
                    {
                        "variant": name,
                        "drafter": drafter,
                        "policy": r.policy,
                        "load": r.load,
                        "err_throughput_tok_s": m["throughput_tok_s"] / r.real_throughput_tok_s - 1,
                        "err_tpot_ms_mean": m["tpot_ms_mean"] / r.real_tpot_ms_mean - 1,
                        "err_ttft_ms_p50": m["ttft_ms_p50"] / r.real_ttft_ms_p50 - 1,
                        # the same with the simulated times scaled by the machine's measured
                        # speed during the cell (a diagnostic, as in fidelity.csv)
                        "adj_err_throughput_tok_s": m["throughput_tok_s"]
                        / slow
                        / r.real_throughput_tok_s
                        - 1,
                        "adj_err_tpot_ms_mean": m["tpot_ms_mean"] * slow / r.real_tpot_ms_mean - 1,
                    }
                )
    return pd.DataFrame(rows)


def _adj(g: pd.DataFrame) -> str:
    if "adj_err_throughput_tok_s" not in g:
        return "n/a | n/a"
    a, b = g["adj_err_throughput_tok_s"].abs(), g["adj_err_tpot_ms_mean"].abs()
    return (
        f"{int((a <= 0.05).sum())} / {int((b <= 0.05).sum())} | {100 * a.median():.1f}% / "
        f"{100 * b.median():.1f}%"
    )


def terms_markdown(df: pd.DataFrame) -> str:
    lines = [
        "| cost model | cells | throughput within 5% | median / worst abs error | mean TPOT within "
        "5% | median / worst | p50 TTFT within 10% | median | speed-adjusted: throughput / "
        "TPOT within 5% | median |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, g in df.groupby("variant", sort=False):
        t, p, f = (g[c].abs() for c in ("err_throughput_tok_s", "err_tpot_ms_mean",
                                        "err_ttft_ms_p50"))  # fmt: skip
        lines.append(
            f"| {name} | {len(g)} | {int((t <= 0.05).sum())} | {100 * t.median():.1f}% / "
            f"{100 * t.max():.1f}% | {int((p <= 0.05).sum())} | {100 * p.median():.1f}% / "
            f"{100 * p.max():.1f}% | {int((f <= 0.10).sum())} | {100 * f.median():.1f}% | "
            f"{_adj(g)} |"
        )
    return "\n".join(lines)


def _phases(cfg: dict) -> str:
    """Where the grid's time went, in words ('' for a report made before phases_s)."""
    ph = cfg.get("phases_s") or {}
    if not ph:
        return ""
    parts = ", ".join(f"{k} {v:.0f} s" for k, v in ph.items())
    probes = cfg.get("speed_reference_cpu_s")
    tail = f"; the speed probes {probes} CPU-s of it" if probes is not None else ""
    return f" ({parts}{tail})"


def _runs_at_a_time(cfg: dict) -> str:
    w = int(cfg.get("workers", 1))
    if w <= 1:
        return "cells run one after another"
    return (
        f"real runs {w} at a time, each in its own process on its own core, with the parent's "
        "speed reference (the profiles and the hog check one at a time)"
    )


def _large_probe(cfg: dict) -> str:
    """The large target probe's part of the speed reference, in words ('' without one)."""
    sizes = cfg.get("speed_probe_tokens", {})
    if len(sizes) < 2:
        return ""
    toks = sorted(sizes.values())
    every = cfg.get("speed_large_every", 1)
    if len(toks) == 2:
        return (
            f"; target forwards of {toks[0]} to {toks[1]} tokens timed at a blend of a "
            f"{toks[0]}-token and a {toks[1]}-token probe's speed, in log tokens, the large one "
            f"re-timed at one calibration in {every}"
        )
    names = " / ".join(str(t) for t in toks)
    return (
        f"; target forwards of {toks[0]} to {toks[-1]} tokens timed at a blend of the {names}"
        f"-token probes' speeds, piecewise in log tokens, the larger ones re-timed at one "
        f"calibration in {every}"
    )


def render(out_dir: Path, command: str, load_note: str = "") -> str:
    """README.md of a finished grid (written next to its tables); returns its text."""
    from specsim.outputs import write_text

    table = pd.read_csv(out_dir / "fidelity.csv")
    cfg = json.loads((out_dir / "config.json").read_text())
    clock = cfg.get("clock", "wall")
    plot_fidelity(table, out_dir / "fidelity.png", clock)
    g = goal_summary(table)
    n = int(g["cells"])
    closed = table[table["concurrency"] > 0]
    lines = [
        "# Fidelity: simulator against the real engine",
        "",
        "Made by (do not edit by hand; rerun it):",
        "",
        "```",
        command,
        "```",
        "",
        f"Machine: {cfg.get('cpu_count')} CPU cores; torch threads {cfg.get('torch_threads')}; "
        f"clock: **{clock}**; {_runs_at_a_time(cfg)}; 1-min load average "
        f"{cfg.get('loadavg_start')} at the start, {cfg.get('loadavg_end')} at the end; "
        f"{cfg.get('elapsed_s', 0):.0f} s in all{_phases(cfg)}. {load_note}",
        "",
        f"Target {cfg.get('target')}, drafters {', '.join(cfg.get('drafters', {}).values())}, "
        f"prompts {' '.join(cfg.get('prompts', []))}, {cfg.get('max_new_tokens')} new tokens "
        f"(traces: {', '.join(cfg.get('traces', {}).values())}).",
        "",
        "## Goals (issue 15) on the " + clock + " clock",
        "",
        "| goal | cells meeting it | worst |abs error| | median |abs error| |",
        "|---|---|---|---|",
    ]
    for m, goal in GOAL.items():
        lines.append(
            f"| {m} within {100 * goal:.0f}% | {int(g[f'within_{m}'])} of {n} | "
            f"{100 * g[f'max_{m}']:.1f}% | {100 * g[f'median_{m}']:.1f}% |"
        )
    med_ok = max(g["median_throughput_tok_s"], g["median_tpot_ms_mean"]) < MEDIAN_GOAL
    sp = within_spread(table)
    lines += [
        "",
        f"Both throughput and mean TPOT within 5%: {int(g['within_both'])} of {n} cells. "
        f"Median absolute error under {100 * MEDIAN_GOAL:.0f}% on both: "
        f"{'yes' if med_ok else 'no'}. The simulator's error is smaller than the real engine's "
        f"own run-to-run spread (throughput and mean TPOT) in {int(sp.sum())} of {n} cells.",
        "",
    ]
    verdict = machine_verdict(table)
    if verdict:
        lines += [verdict, ""]
    if "wall_err_throughput_tok_s" in closed and closed["wall_err_throughput_tok_s"].notna().any():
        w = goal_summary(closed.dropna(subset=["wall_err_throughput_tok_s"]), "wall_")
        lines += [
            f"Same closed-loop runs on the wall clock (the timeline re-stamped, against the "
            f"profile's wall-clock twin): throughput within 5% in "
            f"{int(w['within_throughput_tok_s'])} of {int(w['cells'])}, mean TPOT in "
            f"{int(w['within_tpot_ms_mean'])}; worst {100 * w['max_throughput_tok_s']:.1f}% / "
            f"{100 * w['max_tpot_ms_mean']:.1f}%, median {100 * w['median_throughput_tok_s']:.1f}%"
            f" / {100 * w['median_tpot_ms_mean']:.1f}%.",
            "",
        ]
    if "speed_factor" in table and table["speed_factor"].notna().all():
        f = table["speed_factor"]
        raw_t = ((1 + table["err_throughput_tok_s"]) * f - 1).abs()
        raw_p = ((1 + table["err_tpot_ms_mean"]) / f - 1).abs()
        lines += [
            f"**What the ref clock removed.** Each run's speed factor (its raw CPU seconds over "
            f"its ref-clock seconds: > 1, the core was slower than when the reference was "
            f"taken; probes re-timed every {cfg.get('speed_every_s', 5):g} s of engine time, "
            f"the factor the median of the last {cfg.get('speed_window', 5)}, "
            f"{cfg.get('speed_calibrations', 'n/a')} calibrations, "
            f"{cfg.get('speed_reference_cpu_s', 'n/a')} CPU-s off both clocks"
            f"{_large_probe(cfg)}): cell means "
            f"{f.min():.3f} to {f.max():.3f}. On the raw CPU clock the same runs (times x "
            f"their factor) against the same simulation: throughput within 5% in "
            f"{int((raw_t <= 0.05).sum())} of {n} cells, mean TPOT in "
            f"{int((raw_p <= 0.05).sum())}; median {100 * raw_t.median():.1f}% / "
            f"{100 * raw_p.median():.1f}%.",
            "",
        ]
    if "adj_err_throughput_tok_s" in table:
        a = table["adj_err_throughput_tok_s"].abs()
        b = table["adj_err_tpot_ms_mean"].abs()
        sl = table["slowdown_vs_profile"]
        lines += [
            f"The machine's speed during each cell, from two forwards re-timed before and after "
            f"every run against the same forwards right after profiling (> 1: slower than at "
            f"profiling{'; on the ref clock, what it left' if clock == 'ref' else ''}): "
            f"{sl.min():.3f} to {sl.max():.3f}. Scaling the simulated times by it (a "
            f"diagnostic, not a correction): throughput within 5% in {int((a <= 0.05).sum())} of "
            f"{n} cells, mean TPOT in {int((b <= 0.05).sum())}; median {100 * a.median():.1f}% /"
            f" {100 * b.median():.1f}%.",
            "",
        ]
    hog = out_dir / "hog.csv"
    if hog.exists():
        h = pd.read_csv(hog)
        lines += [
            "## How far the clocks move beside a neighbour",
            "",
            f"One cell ({h['cell'].iloc[0]}) run quiet, beside CPU-spinning processes and "
            "beside memory-streaming processes (started and stopped by the command):",
            "",
            "| condition | hog processes | clock | throughput (tok/s) | vs quiet "
            "| mean TPOT (ms) |",
            "|---|---|---|---|---|---|",
        ]
        for _, r in h.iterrows():
            lines.append(
                f"| {r.condition} | {r.hog_processes} | {r.clock} | {r.throughput_tok_s:.2f} | "
                f"{_pct(r.throughput_vs_quiet)} | {r.tpot_ms_mean:.1f} |"
            )
        lines.append("")
    terms = out_dir / "terms.csv"
    if terms.exists():
        lines += [
            "## What each cost term bought",
            "",
            "The same real runs against the simulator with each term of the measured profile "
            "removed and folded back the way the v1 cost model charged it (`terms.csv`, "
            "torch-free: `specsim.analysis.fidelity_report.term_ablation`):",
            "",
            terms_markdown(pd.read_csv(terms)),
            "",
        ]
    dec = out_dir / "decomposition.csv"
    if dec.exists():
        d = pd.read_csv(dec).dropna(subset=["real_step_ms"])
        lines += [
            "## Per-step decomposition: which term differs",
            "",
            "Mean ms per decode-only step of the first repeat, real (engine timers) against the "
            "cost model's terms at the same steps (same batch, requests, context). Forward = "
            "the target forward; loop = the rest of the step (accepting, streaming, cache "
            "bookkeeping) against the profile's loop overhead at R (`overhead_curve`). All cells "
            "in decomposition.csv.",
            "",
            "| drafter | policy | load | draft real / model | forward real / table | "
            "loop real / model | step real / model |",
            "|---|---|---|---|---|---|---|",
        ]
        for _, r in d.iterrows():
            lines.append(
                f"| {r.drafter} | {r.policy} | {r.load} | {r.real_draft_ms:.1f} / "
                f"{r.model_draft_ms:.1f} | {r.real_forward_ms:.1f} / {r.model_table_ms:.1f} | "
                f"{r.real_loop_ms:.1f} / {r.model_overhead_ms:.1f} | {r.real_step_ms:.1f} / "
                f"{r.model_step_ms:.1f} |"
            )
        lines.append("")
    miss = misses_markdown(table, out_dir / "decomposition.csv")
    if miss:
        lines += [miss, ""]
    miss = ttft_misses_markdown(table, out_dir / "requests.parquet")
    if miss:
        lines += [miss, ""]
    lines += [
        "## Every cell",
        "",
        "Errors are (sim - real) / real against the mean of the real repeats; spread = "
        "(max - min) / mean of the real repeats.",
        "",
        cell_markdown(table, clock),
        "",
        "![simulated against measured](fidelity.png)",
        "",
        "See docs/fidelity.md for the method and the error analysis.",
        "",
    ]
    text = "\n".join(lines)
    write_text(text, out_dir / "README.md")
    return text
