"""The grid: real runs of every cell on llama-server, the simulator's prediction of each, and
the comparison (``fidelity.csv``: one row per cell).

A cell is (setting, temperature, load): a closed loop at C or Poisson arrivals at a rate.
The real side sends the cell's jobs (``specsim bench``'s generator, seeded: the simulator's job
order and arrival times) ``--repeats`` times; the simulated side replays the setting's trace at
that temperature with the same jobs, the profile fitted on the calibration runs, and the
server's capacity (serving model v2: ``max_running`` = slots, a step budget of ``-b`` tokens,
KV reserved per slot).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from specsim.fidelity.llama.config import (
    RANDOM_LAYOUTS,
    LlamaValidationConfig,
    SpecSetting,
    profile_key,
)
from specsim.fidelity.llama.servers import limits, send
from specsim.fidelity.llama.traces import GridInputs
from specsim.serve.llama_trace import path_counts
from specsim.trace.model import Trace

# each compared metric and its short name in fidelity.csv's error columns (err_<short>_wall)
METRICS = {"throughput_tok_s": "throughput", "tpot_ms_mean": "tpot_mean",
           "ttft_ms_mean": "ttft_mean", "e2e_ms_mean": "e2e_mean",
           "steady_throughput_tok_s": "steady_throughput"}  # fmt: skip
# the metrics a cell's interval must be tight on (the goals are on these two)
TIGHT = ("throughput_tok_s", "tpot_ms_mean")
DEFAULT_TOL = 0.03  # the tolerance "converged" is judged at without --target-ci


def loads(cfg: LlamaValidationConfig) -> list[tuple[int | None, float | None]]:
    return [(c, None) for c in cfg.concurrency] + [(None, r) for r in cfg.rates]


def run_cell(
    cfg: LlamaValidationConfig,
    s: SpecSetting,
    srv,  # noqa: ANN001 - a started LlamaServer
    inputs: GridInputs,
    trace: Trace,
    t: float,
    c: int | None,
    rate: float | None,
    seed: int | None = None,
) -> dict[str, Any]:
    """One real run of cell (``s``, ``t``, load) with its jobs drawn from ``seed`` (None: the
    config's): the row ``runs.csv`` keeps of it, with the server's flags (its pinning), the
    seed and the machine's 1-minute load when the run started, so a run's conditions are in
    the table and not only in the README."""
    import os

    from specsim.fidelity.llama.servers import server_args

    pred_d, pred_a = path_counts(trace)
    ref = inputs.outputs[float(t)]
    n = cfg.cell_requests(c)
    load_1m = os.getloadavg()[0]
    seed = cfg.seed if seed is None else int(seed)
    jobs, res, summary = send(srv, inputs.ids, inputs.lengths, temperature=t, seed=seed,
                              concurrency=c, rate=rate, requests=n)  # fmt: skip
    ok = [(j, r) for j, r in zip(jobs, res, strict=True) if not r.error]
    same = sum(r.tokens == ref[j.trace_id] for j, r in ok)
    row = {"spec": s.name, "temperature": float(t), "concurrency": c, "rate": rate,
           "requests": n, "failed": len(res) - len(ok),
           "outputs_as_trace": same / max(len(ok), 1)}  # fmt: skip
    row.update({m: summary.get(m, np.nan) for m in METRICS})
    row["server_drafted"] = sum(r.draft_n or 0 for _, r in ok)
    row["server_accepted"] = sum(r.draft_accepted or 0 for _, r in ok)
    row["trace_drafted"] = int(sum(pred_d[j.trace_id] for j, _ in ok))
    row["trace_accepted"] = int(sum(pred_a[j.trace_id] for j, _ in ok))
    exact = sum((r.draft_n or 0, r.draft_accepted or 0)
                == (pred_d[j.trace_id], pred_a[j.trace_id]) for j, r in ok)  # fmt: skip
    row["requests_counts_exact"] = exact / max(len(ok), 1)
    row["first_error"] = next((r.error for r in res if r.error), "")
    # the drafter GGUF lives in the user's cache: "~", not this machine's home, in a table
    row["server_args"] = " ".join(server_args(cfg, s)).replace(str(Path.home()), "~")
    row["load_1m"] = load_1m
    row["arrival_seed"] = seed
    check_failed([row])
    return row


def check_failed(rows: list[dict[str, Any]]) -> None:
    """Failed grid requests fail the command at once (exit 1, as ``specsim bench``): a cell's
    numbers would be measured on the requests that happened to succeed (or be NaN), a score
    of those is not a score of the server, and the rest of the grid would be hours more of it."""
    from specsim.errors import RunFailed

    failed = sum(int(r["failed"]) for r in rows)
    if failed:
        total = sum(int(r["requests"]) for r in rows)
        r = next(r for r in rows if r["failed"])
        load = f"C={r['concurrency']}" if r["concurrency"] is not None else f"rate={r['rate']:g}"
        raise RunFailed(
            f"{failed} of {total} grid requests failed (cell {r['spec']} T={r['temperature']:g} "
            f"{load}); first error: {r['first_error']}"
        )


def _log_row(log: Callable[[str], None], row: dict[str, Any], what: str) -> None:
    c, rate = row["concurrency"], row["rate"]
    load = f"C={c}" if c is not None else f"rate={rate:g}"
    log(f"  {row['spec']} T={row['temperature']:g} {load} {what}: "
        f"{row['throughput_tok_s']:.1f} tok/s, TPOT {row['tpot_ms_mean']:.2f} ms, outputs as "
        f"trace {row['outputs_as_trace']:.2f}")  # fmt: skip


def real_runs(
    cfg: LlamaValidationConfig,
    s: SpecSetting,
    srv,  # noqa: ANN001 - a started LlamaServer
    inputs: GridInputs,
    traces: dict[float, Trace],
    log: Callable[[str], None],
) -> list[dict[str, Any]]:
    """Every run of setting ``s`` (fixed ``--repeats``): repeats outermost, so a cell's
    repeats are minutes apart."""
    rows = []
    for rep in range(cfg.repeats):
        for t in cfg.temperatures:
            for c, rate in loads(cfg):
                row = run_cell(cfg, s, srv, inputs, traces[float(t)], t, c, rate,
                               seed=cfg.run_seed(rep))  # fmt: skip
                row.update({"repeat": rep, "warmup": False, "round": rep})
                rows.append(row)
                _log_row(log, row, f"rep {rep}")
    return rows


def interleaved_runs(
    cfg: LlamaValidationConfig,
    servers: dict[str, Any],
    inputs: GridInputs,
    traces: dict[tuple[str, float], Trace],
    log: Callable[[str], None],
    after_round: Callable[[int], Any] | None = None,
) -> list[dict[str, Any]]:
    """``--target-ci``: every cell of every setting repeated until its median is tight
    (:func:`specsim.fidelity.repeats.interleaved_schedule`), round-robin over all settings'
    servers at once (each started and calibrated before), so the machine's drift over the
    session falls on every setting's cells alike. Warm-up runs are kept in the rows, marked
    ``warmup`` (``repeat`` < 0), and left out of the scores. ``after_round(r)``: called
    before the first round (r = -1) and after each (the drift probe, :mod:`.drift`)."""
    from specsim.fidelity.repeats import interleaved_schedule

    assert cfg.target_ci is not None
    settings = {s.name: s for s in cfg.settings}
    cells = [(name, float(t), c, rate) for name in servers for t in cfg.temperatures
             for c, rate in loads(cfg)]  # fmt: skip
    rows: list[dict[str, Any]] = []

    def run_one(cell: Any, index: int) -> dict[str, Any]:
        name, t, c, rate = cell
        row = run_cell(cfg, settings[name], servers[name], inputs, traces[(name, t)], t, c, rate,
                       seed=cfg.run_seed(index))  # fmt: skip
        warm = index < cfg.warmup
        row.update({"repeat": index - cfg.warmup, "warmup": warm})
        rows.append(row)
        _log_row(log, row, "warm-up" if warm else f"rep {index - cfg.warmup}")
        return row

    if after_round is not None:
        after_round(-1)
    sched = interleaved_schedule(cells, run_one, tol=cfg.target_ci, min_repeats=cfg.min_repeats,
                                 max_repeats=cfg.max_repeats, warmup=cfg.warmup,
                                 metrics=TIGHT, log=log, after_round=after_round)  # fmt: skip
    for row, run in zip(rows, sched.runs, strict=True):
        row["round"] = run.round
    if sched.wide:
        log(f"  {len(sched.wide)} cells still wider than +-{100 * cfg.target_ci:g}% after "
            f"{cfg.max_repeats} repeats (listed in fidelity.csv: converged = False)")  # fmt: skip
    return rows


def simulate_cell(
    cfg: LlamaValidationConfig,
    s: SpecSetting,
    trace: Trace,
    cost: Any,
    concurrency: int | None,
    rate: float | None,
    slots: Any = None,
    seed: int | None = None,
) -> dict[str, float]:
    """The simulator's summary of one cell (``slots``: a :class:`specsim.sim.slots.LlamaSlots`
    for llama-server's slot choice, ``--slot-rule``; None: the lowest free slots), its jobs
    drawn from ``seed`` as the real run's (None: the config's)."""
    from specsim.sim.simulate import replay

    kw: dict[str, Any] = {"concurrency": concurrency} if concurrency else {"rate": rate}
    if slots is not None:
        kw["slots"] = slots
    with warnings.catch_warnings():
        # prompt tokens are priced per token (prefill_token_ms), not by the table, so a step
        # that prefills past the table's range is no extrapolation of it (the decode tokens
        # are checked against the range by the serving model itself)
        warnings.filterwarnings("ignore", message=".*covers token batches up to")
        seed = cfg.seed if seed is None else int(seed)
        res = replay(trace, s.policy, requests=cfg.cell_requests(concurrency), seed=seed,
                     profile=cost, serving="v2", kv="reserve", record_tokens=False,
                     **limits(cfg), **kw)  # fmt: skip
    out = dict(res.summary)
    # throughput over what specsim bench measures: first send to last finish (the simulator's
    # own counts from t = 0, which an open loop's first arrival is after)
    req = res.requests
    span = float(req["finish_s"].max() - req["arrival_s"].min())
    out["throughput_tok_s"] = float(req["output_tokens"].sum()) / span if span > 0 else np.nan
    return out


def slot_prompts(cfg: LlamaValidationConfig) -> tuple | None:
    """The grid's prompts as the server's token ids (``inputs.json``), where the simulator
    gives each request the slot llama-server would (``--slot-rule llama-server...``)."""
    if cfg.slot_rule in ("lowest", "random"):  # (the config refuses a rule without passes)
        return None
    import json

    ids = json.loads((cfg.out / "inputs.json").read_text())["ids"]
    return tuple(tuple(int(t) for t in p) for p in ids)


def new_slots(cfg: LlamaValidationConfig, prompts: tuple | None, seed: int = 0) -> Any:
    """A fresh server's slots for ``--slot-rule`` (None: the lowest free slots; ``seed``: the
    layout of ``random``)."""
    n = int(limits(cfg)["max_running"])
    if cfg.slot_rule == "random":
        from specsim.sim.slots import RandomSlots

        return RandomSlots(n, cfg.seed + seed)
    if prompts is None:
        return None
    from specsim.sim.slots import LlamaSlots

    return LlamaSlots(n, prompts)


def cell_sim(*args: Any, **kw: Any) -> dict[str, float]:
    """A cell's simulated summary on a fresh server: :func:`draw_sims`' arguments, the
    median over every draw and layout."""
    return _pooled([x for xs in draw_sims(*args, **kw) for x in xs])


def draw_sims(
    cfg: LlamaValidationConfig,
    s: SpecSetting,
    trace: Trace | tuple[Trace, ...],
    cost: Any,
    concurrency: int | None,
    rate: float | None,
    prompts: tuple | None,
    arrival_seeds: Sequence[int | None] = (),
    speeds: Sequence[float] = (),
) -> list[list[dict[str, float]]]:
    """A cell's simulated summaries on a fresh server, one list per draw: each of the real
    runs' ``arrival_seeds`` (none given: the config's seed) on, with ``--slot-rule random``,
    :data:`RANDOM_LAYOUTS` seeded layouts (one layout is one draw of where a grid's server has
    its free slots; every other rule one). ``speeds`` (one per seed, :mod:`.drift`): each
    draw simulated on ``cost``'s times scaled by its run's speed. ``trace``: one trace, or a
    tuple of one per seed (``--trace-draws``: each run on its own recorded draw)."""
    from specsim.sim.cost.model import time_scaled

    layouts = range(RANDOM_LAYOUTS) if cfg.slot_rule == "random" else range(1)
    draws = tuple(arrival_seeds) or (None,)
    factors = tuple(speeds) or (1.0,) * len(draws)
    if len(factors) != len(draws):
        raise ValueError("cell_sim: one speed per arrival seed")
    per = trace if isinstance(trace, tuple) else (trace,) * len(draws)
    if len(per) != len(draws):
        raise ValueError("cell_sim: one trace per arrival seed")
    priced = [time_scaled(cost, f) for f in factors]  # each draw's profile, built once
    return [[simulate_cell(cfg, s, tr, p, concurrency, rate, new_slots(cfg, prompts, k), a)
             for k in layouts] for a, p, tr in zip(draws, priced, per, strict=True)]  # fmt: skip


def _pooled(sims: list[dict[str, float]]) -> dict[str, float]:
    return sims[0] if len(sims) == 1 else _median_summary(sims)


def history_sims(
    cfg: LlamaValidationConfig,
    runs: pd.DataFrame,
    traces: Mapping[tuple[str, float], Trace | tuple[Trace, ...]],
    costs: dict[tuple[bool, float], Any],
    prompts: tuple,
    speeds: pd.Series | None = None,
) -> dict[Any, dict[str, float]]:
    """``--slot-rule llama-server-history``: every run of ``runs`` (warm-ups included) simulated
    in the order it ran, each setting's runs on one simulated server whose slots carry over
    from run to run (the grid's server runs them all, starting empty), keyed by the run's row;
    ``speeds`` (by row, :mod:`.drift`): each run priced at its own speed."""
    from specsim.sim.cost.model import time_scaled

    out: dict[Any, dict[str, float]] = {}
    names = {s.name for s in cfg.settings}
    for spec, g in runs.groupby("spec", sort=False):
        if spec not in names:  # a setting this score leaves out: its server's runs too
            continue
        s, state = SpecSetting.parse(spec), new_slots(cfg, prompts)
        for i, r in g.iterrows():
            c, rate = _load(r["concurrency"], r["rate"])
            t = float(r["temperature"])
            cost = costs[profile_key(spec, t)]
            if speeds is not None:
                cost = time_scaled(cost, float(speeds[i]))
            tr = run_trace(traces[(spec, t)], r)
            out[i] = simulate_cell(cfg, s, tr, cost, c, rate, state, logged_seed(cfg, r))
    return out


def run_trace(draws: Trace | tuple[Trace, ...], run: pd.Series) -> Trace:
    """The trace a run of ``runs.csv`` is simulated on: with ``--trace-draws K`` (``draws`` a
    tuple), kept run j of its cell on draw j mod K (a warm-up on draw 0), so that a cell's
    runs average K recorded samples of the setting's acceptance, as the real runs sample
    answers of their own; else the one trace."""
    if not isinstance(draws, tuple):
        return draws
    rep = run.get("repeat", -1)
    j = int(rep) if rep is not None and not pd.isna(rep) and int(rep) >= 0 else 0
    return draws[j % len(draws)]


def logged_seed(cfg: LlamaValidationConfig, run: pd.Series) -> int | None:
    """The seed a run in ``runs.csv`` drew its jobs from where its cell's runs differ
    (``--arrival-seeds per-run``), else None (the config's, as every earlier grid's)."""
    if cfg.arrival_seeds != "per-run":
        return None
    from specsim.errors import SpecsimError

    if "arrival_seed" not in run.index or pd.isna(run["arrival_seed"]):
        raise SpecsimError(
            "--arrival-seeds per-run scores runs by their own seeds, and runs.csv has none "
            "(a grid measured before them); rescore with --arrival-seeds fixed"
        )
    return int(run["arrival_seed"])


def _load(c: Any, rate: Any) -> tuple[int | None, float | None]:
    """A run's load as ``runs.csv`` holds it (the other one NaN): a closed loop's C or a rate."""
    return (None if pd.isna(c) else int(c)), (None if pd.isna(rate) else float(rate))


def _median_summary(sims: list[dict[str, float]]) -> dict[str, float]:
    """The median of each number over the runs' simulated summaries."""
    keys = [k for k, v in sims[0].items() if isinstance(v, int | float)]
    return {k: float(np.median([float(x.get(k, np.nan)) for x in sims])) for k in keys}


def compare(
    cfg: LlamaValidationConfig,
    runs: pd.DataFrame,
    traces: Mapping[tuple[str, float], Trace | tuple[Trace, ...]],
    costs: dict[tuple[bool, float], Any],
    probes: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """One row per cell: the real median over the kept repeats (warm-ups left out) with its
    95% interval (:func:`specsim.fidelity.repeats.median_interval`; ``converged``: within
    ``--target-ci``, else 3%, on throughput and mean TPOT) and spread, the simulator, signed
    errors against the median. With two repeats the median is their mean, as before.
    ``probes`` (``probes.csv``, :mod:`.drift`): every run simulated at its round's speed.
    ``traces``: one per (setting, T), or with ``--trace-draws`` a tuple of its draws
    (:func:`run_trace`)."""
    from specsim.fidelity.repeats import median_interval

    tol = cfg.target_ci if cfg.target_ci is not None else DEFAULT_TOL
    prompts = slot_prompts(cfg)
    hist = speeds = None
    runs = runs.reset_index(drop=True)  # a run's row: its key in hist and speeds
    if probes is not None:
        from specsim.fidelity.llama.drift import run_speeds

        speeds = run_speeds(runs, probes)
    if cfg.slot_rule == "llama-server-history" and prompts is not None:
        hist = history_sims(cfg, runs, traces, costs, prompts, speeds)
    if "warmup" in runs.columns:
        runs = runs[~runs["warmup"].astype(bool)]
    rows = []
    keys = ["spec", "temperature", "concurrency", "rate"]
    for key, g in runs.groupby(keys, dropna=False, sort=False):
        spec, t, c, rate = key
        s = SpecSetting.parse(spec)
        c, rate = _load(c, rate)
        cost = costs[profile_key(spec, t)]
        found = traces[(spec, float(t))]
        per: list[dict[str, float]] | None = None  # each kept run's own simulation
        if hist is not None:  # the median over the cell's runs, each on the server's history
            per = [hist[i] for i in g.index]
            sim = _median_summary(per)
        elif cfg.arrival_seeds == "per-run":  # each kept run on its seed, draw and speed, once
            seeds = tuple(logged_seed(cfg, r) for _, r in g.iterrows())
            tr = tuple(run_trace(found, r) for _, r in g.iterrows())
            f = () if speeds is None else tuple(speeds[g.index])
            by_run = draw_sims(cfg, s, tr, cost, c, rate, prompts, seeds, f)
            per = [_pooled(x) for x in by_run]
            sim = _pooled([x for xs in by_run for x in xs])
        elif speeds is not None:  # each kept run's draw at its own speed
            seeds = tuple(logged_seed(cfg, r) for _, r in g.iterrows())
            trs = tuple(run_trace(found, r) for _, r in g.iterrows())
            tr = trs if isinstance(found, tuple) else found
            sim = cell_sim(cfg, s, tr, cost, c, rate, prompts, seeds, tuple(speeds[g.index]))
        elif isinstance(found, tuple):  # --trace-draws: each kept run's (seed, trace) once
            pairs = {(logged_seed(cfg, r), id(run_trace(found, r))): r for _, r in g.iterrows()}
            runs_ = list(pairs.values())
            seeds = tuple(logged_seed(cfg, r) for r in runs_)
            sim = cell_sim(cfg, s, tuple(run_trace(found, r) for r in runs_), cost, c, rate,
                           prompts, seeds)  # fmt: skip
        else:
            draws = tuple(sorted({logged_seed(cfg, r) for _, r in g.iterrows()} - {None}))
            sim = cell_sim(cfg, s, found, cost, c, rate, prompts, draws)
        row: dict[str, Any] = {"grid": cfg.grid_label, "spec": spec, "temperature": t,
                               "concurrency": c, "rate": rate, "repeats": len(g)}  # fmt: skip
        converged = True
        for m, short in METRICS.items():
            real = g[m].to_numpy(np.float64)
            iv = median_interval(real)
            med = iv.median
            row[f"real_{m}"] = med
            row[f"sim_{m}"] = float(sim.get(m, np.nan))
            row[f"err_{short}_wall"] = row[f"sim_{m}"] / med - 1.0 if med else np.nan
            if m in TIGHT:
                fin = real[np.isfinite(real)]
                spread = (fin.max() - fin.min()) / med if len(fin) else np.nan
                row[f"spread_{short}"] = float(spread)
                row[f"real_{m}_lo"], row[f"real_{m}_hi"] = iv.lo, iv.hi
                row[f"ci_{short}"] = iv.half_width()
                row["interval"] = iv.method
                converged = converged and iv.within(tol)
        row["converged"] = converged
        row["spread_real"] = max(row["spread_throughput"], row["spread_tpot_mean"])
        if per is not None and cfg.arrival_seeds == "per-run":  # each run against its own
            from specsim.fidelity.llama.paired import paired_columns

            row.update(paired_columns(g, per, tol))
        drafted, accepted = g["server_drafted"].sum(), g["server_accepted"].sum()
        row["real_accept_per_draft"] = accepted / drafted if drafted else np.nan
        v, a = sim.get("verified_draft_tokens", 0), sim.get("accepted_draft_tokens", 0)
        row["sim_accept_per_draft"] = a / v if v else np.nan
        # raw counts (the repeats' sums; the simulator's run once per repeat) for pooled rates
        row["real_drafted"], row["real_accepted"] = int(drafted), int(accepted)
        row["sim_drafted"], row["sim_accepted"] = int(v) * len(g), int(a) * len(g)
        row["real_drafted_per_request"] = drafted / g["requests"].sum()
        row["sim_drafted_per_request"] = v / max(sim.get("requests_completed", 1), 1)
        row["outputs_as_trace"] = float(g["outputs_as_trace"].mean())
        row["requests_counts_exact"] = float(g["requests_counts_exact"].mean())
        rows.append(row)
    return pd.DataFrame(rows)


def rankings(table: pd.DataFrame, metric: str = "throughput_tok_s") -> pd.DataFrame:
    """Per (temperature, load): the settings ranked by the real and by the simulated metric.
    A pair counts where the real difference exceeds both settings' real uncertainty: their
    medians' 95% intervals do not overlap (issue #48, tables with intervals), else the gap
    exceeds both settings' spread (max - min of the repeats; tables of fixed repeats)."""
    rows = []
    higher = metric.startswith("throughput")
    intervals = {f"real_{metric}_lo", f"real_{metric}_hi"} <= set(table.columns)
    for key, g in table.groupby(["temperature", "concurrency", "rate"], dropna=False):
        g = g.reset_index(drop=True)
        real, sim = g[f"real_{metric}"].to_numpy(), g[f"sim_{metric}"].to_numpy()
        spread = g["spread_real"].to_numpy() * np.abs(real)
        if intervals:
            lo, hi = g[f"real_{metric}_lo"].to_numpy(), g[f"real_{metric}_hi"].to_numpy()
        pairs = agree = 0
        for i in range(len(g)):
            for j in range(i + 1, len(g)):
                apart = (
                    lo[i] > hi[j] or lo[j] > hi[i]
                    if intervals
                    else abs(real[i] - real[j]) > max(spread[i], spread[j])
                )
                if not apart:
                    continue
                pairs += 1
                agree += int(np.sign(real[i] - real[j]) == np.sign(sim[i] - sim[j]))
        names = g["spec"].to_numpy()
        real_order = " > ".join(names[np.argsort(-real if higher else real)])
        sim_order = " > ".join(names[np.argsort(-sim if higher else sim)])
        rows.append({"temperature": key[0], "concurrency": key[1], "rate": key[2],
                     "real_order": real_order, "sim_order": sim_order,
                     "pairs_beyond_spread": pairs, "pairs_agree": agree,
                     "pair_rule": "intervals" if intervals else "spread"})  # fmt: skip
    return pd.DataFrame(rows)
