"""The words of ``reports/llama-cpp/README.md``, filled in with a run's numbers (kept apart
from :mod:`.report`, which computes them, so the prose can be read and edited as prose)."""

from __future__ import annotations

import pandas as pd

from specsim.fidelity.llama.config import LlamaValidationConfig


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _pair_rule(ranks: pd.DataFrame) -> str:
    """Which pairs of settings the ranking judges (:func:`specsim.fidelity.llama.grid.rankings`)."""
    if "pair_rule" in ranks.columns and len(ranks) and (ranks["pair_rule"] == "intervals").all():
        return "the real medians' intervals do not overlap"
    return "the real gap exceeds the real spread"


def goal_rows(
    g: dict[str, float], ranks: pd.DataFrame, minutes: float, load: tuple, limit: float = 60.0
) -> str:
    """The goals table: one row per goal of issue #34 (#48 for a held-out grid: ``limit``
    minutes), its measured value, met or not."""
    rk = ranks[ranks["pairs_beyond_spread"] > 0]
    pairs, agree = int(rk["pairs_beyond_spread"].sum()), int(rk["pairs_agree"].sum())
    l0, l1 = load
    rows = []
    tight = "converged_cells" in g  # judged where the real interval is tight (issue #48)
    where = (
        f" (the {int(g['converged_cells'])} of {int(g['cells'])} cells whose real interval is "
        "within the tolerance)"
        if tight
        else ""
    )
    for m, what in (("throughput", "throughput"), ("tpot_mean", "mean TPOT")):
        med, worst = g[f"{m}_median_abs"], g[f"{m}_max_abs"]
        every = (f"{_pct(med)} median, worst {_pct(worst)}; {_pct(g[f'{m}_within_5'])} within "
                 f"5%, {_pct(g[f'{m}_within_10'])} within 10%")  # fmt: skip
        if tight:
            med_t, worst_t = g[f"{m}_median_abs_converged"], g[f"{m}_max_abs_converged"]
            # no tight cell: nothing to judge the goal on, so it is not met (and no "nan%")
            none = not g["converged_cells"]
            rows.append((f"median abs. error of {what} <= 5%{where}",
                         f"{'no such cell' if none else _pct(med_t)} (every cell: {every})",
                         bool(med_t <= 0.05)))  # fmt: skip
            rows.append((f"every such cell's {what} within 10%",
                         "no such cell" if none else f"worst {_pct(worst_t)}",
                         bool(worst_t <= 0.10)))  # fmt: skip
            continue
        rows.append(
            (f"median abs. error of {what} <= 5%",
             f"{_pct(med)} ({_pct(g[f'{m}_within_5'])} of cells within 5%)", med <= 0.05)
        )  # fmt: skip
        rows.append(
            (f"every cell's {what} within 10%",
             f"worst {_pct(worst)} ({_pct(g[f'{m}_within_10'])} within 10%)", worst <= 0.10)
        )  # fmt: skip
    gap = g["accept_gap_max"]
    rows.append(
        ("accepted per drafted token, trace vs server, within 3% (per cell)",
         f"worst {_pct(gap)}, median {_pct(g['accept_gap_median'])}", gap <= 0.03)
    )  # fmt: skip
    pooled = g["accept_gap_pooled_max"]
    rows.append(
        ("the same, pooled over the loads of each setting and temperature",
         f"worst {_pct(pooled)}", pooled <= 0.03)
    )  # fmt: skip
    if "gain_gap_max_points" in g:
        wrong, judged = int(g["gain_signs_wrong"]), int(g["gain_signs_judged"])
        rows.append(
            ("each setting's gain over `none` within +-10 points of the server's, its sign right "
             "(closed loops: throughput; open: TPOT speed-up; `gains.csv`)",
             f"worst {g['gain_gap_max_points']:.1f} points; sign wrong in {wrong} of {judged} "
             "cells whose real gain is beyond +-2%",
             g["gain_gap_max_points"] <= 10.0 and wrong == 0)
        )  # fmt: skip
    rule = _pair_rule(ranks)
    rows.append(
        (f"ranking of the settings where {rule}", f"{agree} of {pairs} pairs agree",
         agree == pairs)
    )  # fmt: skip
    rows.append(
        (f"grid in <= {limit:g} minutes",
         f"{minutes:.1f} min (1-min load {l0[0]:.2f} before, {l1[0]:.2f} after)", minutes <= limit)
    )  # fmt: skip
    body = "\n".join(f"| {a} | {b} | {_met(ok)} |" for a, b, ok in rows)
    return "| goal | measured | |\n|---|---|---|\n" + body + "\n"


def _kinds(cfg: LlamaValidationConfig) -> str:
    """What the setting names mean, the draft-dspark ones only where the grid has them (and
    then which drafter)."""
    out = f"ngram:M = `--spec-type ngram-simple`, lookup {cfg.ngram_n}, draft size M"
    if cfg.ngram_trace == "server":
        out += ", traces from each server's own step log"
    if cfg.trace_draws > 1:
        out += (
            f" ({cfg.trace_draws} recording runs of every speculative trace, each its own "
            f"draw; kept run j of a cell simulated on draw j mod {cfg.trace_draws})"
        )
    if any(s.kind == "dspark" for s in cfg.settings):
        out += (
            f"; dspark:N[:P] = `--spec-type draft-dspark --spec-draft-n-max N "
            f"--spec-draft-p-min P`, drafter {cfg.dspark_drafter}; "
            + (
                "traces from each server's own step log, "
                if cfg.dspark_trace == "server"
                else "traces from its torch replay, "
            )
            + (
                "calibrated on its server's logged steps"
                if cfg.step_clock == "server"
                else "calibrated on its torch replay's steps (docs/llama-cpp.md, 'Not yet')"
            )
        )
    return out


def _repeats(cfg: LlamaValidationConfig) -> str:
    """How often each cell ran: fixed repeats, or the repeat rule (docs/fidelity.md)."""
    if cfg.target_ci is None:
        return f"{cfg.repeats} repeats of every cell"
    return (
        f"every cell repeated until the 95% interval of its median throughput and mean TPOT "
        f"is within +-{100 * cfg.target_ci:g}% ({cfg.min_repeats} to {cfg.max_repeats} kept "
        f"runs, {cfg.warmup} warm-up discarded, round-robin over every setting's cells)"
    )


def render(
    cfg: LlamaValidationConfig,
    g: dict[str, float],
    ranks: pd.DataFrame,
    cells: str,
    minutes: float,
    load: tuple,
    machine: str,
    rescored: bool = False,
    command: str = "",
) -> str:
    """The README: what was run, the goals, every cell, the rankings."""
    specs = ", ".join(cfg.specs)
    conc = ", ".join(map(str, cfg.concurrency))
    rates = ", ".join(f"{r:g}" for r in cfg.rates) or "none"
    temps = ", ".join(f"{t:g}" for t in cfg.temperatures)
    calib = ", ".join(map(str, cfg.calib_concurrency))
    prompts = " ".join(cfg.prompts)
    rank_cols = ["temperature", "concurrency", "rate", "real_order", "sim_order",
                 "pairs_beyond_spread", "pairs_agree", "metric"]  # fmt: skip
    rk = ranks[rank_cols].astype(object).fillna("").astype(str)  # object: "" fills a float
    rank_md = "| " + " | ".join(rank_cols) + " |\n|" + "---|" * len(rank_cols) + "\n"
    rank_md += "\n".join("| " + " | ".join(r) + " |" for r in rk.itertuples(index=False))
    note = (
        "\n**Rescored** (`--rescore`): the simulator's side was computed again from the saved "
        "runs after the grid had been seen (the notes below say what, if anything, changed).\n"
        if rescored
        else ""
    )
    return f"""# llama-server as the simulator's reference (wall clock)

The simulator predicts what `specsim bench` measures on llama.cpp's `llama-server` (build
11434, SmolLM2-135M-Instruct {cfg.target_type}, CPU), from a profile fitted on calibration
runs that share neither prompts nor concurrencies with the grid. Method and how to use it:
[docs/llama-cpp.md](../../docs/llama-cpp.md).
{note}
## Results against the goals

{goal_rows(g, ranks, minutes, load, 75.0 if cfg.grid_label == "held-out" else 60.0)}
## Grid

- settings: {specs} ({_kinds(cfg)})
- closed loops at C = {conc} ({cfg.min_requests} requests or 3C); Poisson at {rates} req/s
  ({cfg.open_requests} requests); temperatures {temps}; {_repeats(cfg)}
- prompts: {prompts}, outputs of each prompt's greedy length (at most {cfg.max_tokens})
- calibration (the profile): {cfg.calib_prompts} at C = {calib}, its steps timed by the
  {cfg.step_clock}'s clock; speculative terms: {", ".join(cfg.terms) or "none"}
- server: `-np {cfg.parallel} -c {cfg.parallel * cfg.ctx_per_slot} -t {cfg.threads}
  --threads-batch {cfg.threads if cfg.threads_batch is None else cfg.threads_batch}`
- machine: {machine}

Rerun (about the minutes above, alone on the machine):

```
{command or f"specsim validate --engine llama-server --out {cfg.out} --force"}
```

and `--rescore` added to score the saved runs again without a server. Every flag is also in
`config.json`.

## Every cell

{cells}
## Rankings (per load; pairs counted where {_pair_rule(ranks)})

{rank_md}
"""
