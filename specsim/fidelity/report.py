"""The fidelity report's page (README.md) from the tables ``specsim validate`` writes:
``render(out_dir, command)`` re-renders a committed report without torch."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from specsim.fidelity.ablation import terms_markdown
from specsim.fidelity.metrics import GOAL, MEDIAN_GOAL
from specsim.fidelity.plot import plot_fidelity
from specsim.fidelity.tables import (
    cell_markdown,
    goal_summary,
    machine_verdict,
    misses_markdown,
    pct,
    three_clocks,
    ttft_misses_markdown,
    within_spread,
)


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


def _grid_note(table: pd.DataFrame) -> str:
    """Which cells the method was tuned on and which it never saw (the ``grid`` column)."""
    grids = (
        table["grid"].fillna("tuning") if "grid" in table else pd.Series(["tuning"] * len(table))
    )
    counts = grids.value_counts()
    held = int(counts.get("held-out", 0))
    text = (
        f"Cells: {int(counts.get('tuning', 0))} tuning, {held} held-out (`grid` column). A tuning "
        "cell is one the method was developed on: its calibration concurrencies are the scored "
        "ones and it went through several versions on the same prompts, so its errors are "
        "in-sample."
    )
    if not held:
        text += " No held-out grid has been run yet: read every number here as in-sample."
    return text


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
        "## Three clocks, side by side",
        "",
        "The same runs scored on each clock (signed errors per cell in `fidelity.csv`: "
        "`err_*` ref, `wall_err_*` wall; raw CPU derived from each run's speed factor, "
        "`specsim.fidelity.tables.with_raw_clock`). The simulator is "
        "'faster' in a cell when its throughput is above the engine's.",
        "",
        three_clocks(table).to_markdown(index=False),
        "",
        _grid_note(table),
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
                f"{pct(r.throughput_vs_quiet)} | {r.tpot_ms_mean:.1f} |"
            )
        lines.append("")
    terms = out_dir / "terms.csv"
    if terms.exists():
        lines += [
            "## What each cost term bought",
            "",
            "The same real runs against the simulator with each term of the measured profile "
            "removed and folded back the way the v1 cost model charged it (`terms.csv`, "
            "torch-free: `specsim.fidelity.ablation.term_ablation`):",
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
