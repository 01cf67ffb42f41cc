"""The fidelity report's verdicts and Markdown tables, from ``fidelity.csv`` and friends
(torch-free, so a committed report re-renders anywhere)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from specsim.fidelity.metrics import GOAL

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


def pct(x: float) -> str:
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
            f"{pct(r.wall_err_throughput_tok_s)} / {pct(r.wall_err_tpot_ms_mean)}"
            if "wall_err_throughput_tok_s" in r and np.isfinite(r.wall_err_throughput_tok_s)
            else "(open loop: run's clock only)"
        )
        lines.append(
            f"| {r.drafter} | {r.policy} | {r.load} | {r.jobs} x {r.repeats} | "
            f"{r.real_throughput_tok_s:.2f} / {r.sim_throughput_tok_s:.2f} | "
            f"{pct(r.err_throughput_tok_s)} | {100 * r.spread_throughput_tok_s:.1f}% | "
            f"{r.real_tpot_ms_mean:.1f} / {r.sim_tpot_ms_mean:.1f} | {pct(r.err_tpot_ms_mean)} | "
            f"{100 * r.spread_tpot_ms_mean:.1f}% | {pct(r.err_tpot_ms_p90)} | "
            f"{pct(r.err_ttft_ms_p50)} | {r.real_tau:.2f} / {r.sim_tau:.2f} | "
            f"{'yes' if ok else 'no'} | {wall} | {r.slowdown_vs_profile:.3f} | "
            f"{pct(r.adj_err_throughput_tok_s)} / {pct(r.adj_err_tpot_ms_mean)} | "
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
            f"| {r.drafter} | {r.policy} | {r.load} | {pct(r.err_throughput_tok_s)} / "
            f"{pct(r.err_tpot_ms_mean)} | {100 * r.spread_throughput_tok_s:.1f}% | {cols} |"
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
            f"{pct(r.err_ttft_ms_p50)} | "
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


CLOCKS = (
    (
        "ref",
        "",
        "CPU time rescaled to the core's speed when the grid began (a correction of "
        "the measured side; its probe blend was chosen by looking at an earlier grid's errors)",
    ),
    ("raw CPU", "cpu_", "the engine's CPU time as measured, no correction"),
    ("wall", "wall_", "wall-clock time, what a user waits (closed loops only)"),
)


def with_raw_clock(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with raw-CPU-clock errors (``cpu_err_*``) derived from the ref clock's.

    A run's speed factor is its raw CPU seconds over its ref seconds, so its raw throughput is
    the ref one over the factor and its raw TPOT the ref one times it; the simulation is the
    same on both clocks. Without a ``speed_factor`` column (a grid on the cpu clock) the raw
    errors are the table's own.
    """
    out = table.copy()
    f = out["speed_factor"] if "speed_factor" in out else pd.Series(1.0, index=out.index)
    for m in GOAL:
        e = out[f"err_{m}"]
        out[f"cpu_err_{m}"] = (1 + e) * f - 1 if m == "throughput_tok_s" else (1 + e) / f - 1
    return out


def three_clocks(table: pd.DataFrame) -> pd.DataFrame:
    """One row per clock: cells, how many meet the throughput / mean-TPOT goals, medians, and
    how often the simulator is the faster side (a bias shows as a share far from one half)."""
    t = with_raw_clock(table)
    rows = []
    for name, prefix, what in CLOCKS:
        col = f"{prefix}err_throughput_tok_s"
        if col not in t or t[col].notna().sum() == 0:
            continue
        sub = t.dropna(subset=[col, f"{prefix}err_tpot_ms_mean"])
        g = goal_summary(sub, prefix)
        n = int(g["cells"])
        rows.append({
            "clock": name, "what it is": what, "cells": n,
            "throughput within 5%": f"{int(g['within_throughput_tok_s'])} of {n}",
            "mean TPOT within 5%": f"{int(g['within_tpot_ms_mean'])} of {n}",
            "both": f"{int(g['within_both'])} of {n}",
            "median abs error, throughput / TPOT": f"{100 * g['median_throughput_tok_s']:.1f}% / "
            f"{100 * g['median_tpot_ms_mean']:.1f}%",
            "simulator faster": f"{int((sub[col] > 0).sum())} of {n}",
        })  # fmt: skip
    return pd.DataFrame(rows)
