"""A fidelity grid, phase by phase: the simulator against a real engine on the same prompts,
load and clock (``specsim validate``; method in docs/fidelity.md).

For each cell (drafter, policy, closed loop at C or open-loop Poisson at a rate) the real engine
(:mod:`specsim.torch_engine.engine`) serves the trace's prompts ``repeats`` times, and the
simulator replays the recorded trace of the same prompts with the same policy, load, job order
(the same seeded workload) and the cost profile measured from the engine's own components
(:mod:`specsim.torch_engine.cost_calibration`) on the SAME clock.

Clocks: the engine runs on ``clock`` (``cpu``: a virtual clock of its thread's CPU time, which
the neighbours on a shared machine cannot move much; ``ref``: that CPU time at the speed the
core had when the grid started; ``wall``: real time). Every step is also stamped on the wall
clock, so a closed-loop run on the CPU clock yields its wall-clock timeline too
(:func:`specsim.fidelity.metrics.retime`), and both sides are compared on both clocks (the wall
side against the profile's wall-clock twin). Open-loop cells are compared on the run's own clock
only (arrivals interleave with the clock).

The phases, in order (each timed into ``config.json``'s ``phases_s``): load the models, take the
speed reference, record or read the traces and measure the profiles, time the layouts, run the
simulated side, the hog check, the real runs, then assemble and write the tables. Only
torch-free code runs at import; the engine is imported inside the phases.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from specsim.errors import SpecsimError
from specsim.fidelity.assemble import assemble
from specsim.fidelity.config import Cell, RunSpec, ValidationConfig, cell_jobs, max_concurrency
from specsim.fidelity.real import (
    _STATE,
    PROBE_POINTS,
    hog_check,
    init_worker,
    layouts_table,
    record_trace_for,
    ref_spec,
    run_real,
)
from specsim.fidelity.simulated import simulate_grid


@dataclass
class _Grid:
    """What the phases hand each other."""

    cfg: ValidationConfig
    say: Any
    phases: dict[str, float] = field(default_factory=dict)
    ref: Any = None
    ref_kw: dict[str, Any] = field(default_factory=dict)
    prompts: list = field(default_factory=list)
    ids: list = field(default_factory=list)
    per: dict[str, dict[str, Any]] = field(default_factory=dict)
    grid: list[Cell] = field(default_factory=list)
    sims: dict = field(default_factory=dict)
    rates: dict = field(default_factory=dict)
    specs: list[RunSpec] = field(default_factory=list)
    results: dict = field(default_factory=dict)


def run_validation(cfg: ValidationConfig, log: Any = None) -> pd.DataFrame:
    """Run the grid; write its tables, step logs, profiles and ``config.json`` under
    ``cfg.out``. With ``clock="ref"`` the process's speed reference is set for the run and
    cleared after it."""
    from specsim.torch_engine.clock import check_clock, use_reference

    table_path = cfg.out / "fidelity.csv"
    if table_path.exists() and not cfg.force:
        raise SpecsimError(f"{table_path} exists; pass --force to overwrite it")
    check_clock(cfg.clock, cfg.device, 1)
    g = _Grid(cfg, log or (lambda msg: None))
    t_start, load_start = time.perf_counter(), os.getloadavg()[0]
    lap = _lap(g.phases)
    cfg.out.mkdir(parents=True, exist_ok=True)
    try:
        init_worker(cfg.target, list(cfg.drafters), cfg.device, 1)
        lap("loading the models")
        if cfg.clock == "ref":
            take_reference(g)
            lap("speed reference")
        traces_and_profiles(g)
        lap("traces and profiles")
        if not cfg.profile:
            time_layouts(g)
        simulated_side(g)
        lap("layouts and the simulated side")
        if cfg.hog_check:
            run_hog_check(g)
            lap("hog check")
        real_runs(g)
        lap(f"{len(g.specs)} real runs")
        table = write_tables(g, table_path)
        write_config(g, t_start, load_start)
        return table
    finally:
        use_reference(None)


def take_reference(g: _Grid) -> None:
    """One speed reference for the profiles and every run: the same units throughout."""
    from specsim.torch_engine.clock import use_reference
    from specsim.torch_engine.speed import speed_reference

    c = g.cfg
    g.say("taking the speed reference (a target forward, each drafter's proposal)")
    g.ref_kw = {
        "every_s": c.ref_every,
        "window": c.ref_window,
        "probe": c.ref_probe,
        "large_tokens": c.ref_large,
        "large_every": c.ref_large_every,
        "mid_tokens": c.ref_mid,
    }
    proposers = {f"draft:{d}": _STATE["proposers"][d] for d in c.drafters}
    g.ref = speed_reference(_STATE["target"].model, proposers, **g.ref_kw)
    use_reference(g.ref)


def traces_and_profiles(g: _Grid) -> None:
    """Each drafter's trace (recorded if missing, then checked against the prompts) and the
    engine's cost profile measured with that drafter (or the given ``--profile``)."""
    from specsim.prompts import load_many
    from specsim.record.models import prompt_ids
    from specsim.sim.cost_profiles import get_profile
    from specsim.torch_engine.proposers import make_proposer
    from specsim.trace.io import read_trace

    c = g.cfg
    target = _STATE["target"]
    g.prompts = load_many(list(c.prompts))
    g.ids = [prompt_ids(target.tokenizer, p.text) for p in g.prompts]
    shared = None  # with shared_table: the first drafter's profile, whose table the rest reuse
    for d in c.drafters:
        proposer, drafter_name = make_proposer(d, target)
        path = c.trace_for(d)
        if not path.exists():
            g.say(f"recording {path} ({len(g.prompts)} prompts, {c.max_new_tokens} new tokens)")
            record_trace_for(
                target, proposer, drafter_name, g.prompts, path, c.max_new_tokens, c.seed
            )
        trace = read_trace(path)
        _check_trace(trace, path, drafter_name, g.ids, list(c.prompts))
        by_trace = [g.ids[int(i)] for i in trace.request_ids]
        lens = np.array([len(p) for p in by_trace])
        if c.profile:
            cost, other = get_profile(c.profile), None
        else:
            prof = measure_drafter_profile(g, d, proposer, trace, lens, shared)
            if c.shared_table and shared is None:
                shared = prof
            cost, other = prof.cost, prof.other
        g.per[d] = {
            "name": drafter_name,
            "trace": trace,
            "path": path,
            "ids": by_trace,
            "cost": cost,
            "other": other,
        }


def measure_drafter_profile(g: _Grid, d: str, proposer: Any, trace: Any, lens, shared):  # type: ignore[no-untyped-def]
    """The engine's cost profile with drafter ``d`` on the grid's clock, written with its
    other-clock twin, its points, per-request splits and terms."""
    from specsim.policies.base import get_policy
    from specsim.sim.cost_profiles import write_profile_csv
    from specsim.torch_engine.cost_calibration import DEFAULT_B, measure_profile

    c = g.cfg
    target = _STATE["target"]
    g.say(f"measuring the engine's cost profile with drafter {d} ({c.clock} clock)")
    longest = int(lens.max() + trace.output_len.max())
    grid = sorted(c.contexts)
    ctxs = tuple(x for x in grid if x < longest) + tuple(x for x in grid if x >= longest)[:1]
    prof = measure_profile(
        target.model,
        proposer,
        get_policy("hw-aware"),
        name=f"engine-{target.name}-{d.replace(':', '')}",
        batch_tokens=c.profile_batches or DEFAULT_B,
        contexts=ctxs,
        requests=tuple(sorted({1, 2, 4, 8, min(max_concurrency(c.cells), 16)})),
        draft_context=int(np.median(lens + trace.output_len // 2)),
        repeats=c.profile_repeats,
        layout=c.layout,
        seed=c.seed,
        limits={"prefill_budget": c.prefill_budget},
        clock=c.clock,
        draft_phase=f"draft:{d}",
        table=shared if shared is not None and _same_table(shared, ctxs) else None,
        table_repeats=c.profile_repeats * len(c.drafters) if c.shared_table else None,
    )
    tag = d.replace(":", "")
    out = c.out
    write_profile_csv(prof.cost, out / f"profile-{tag}.csv", force=True)
    write_profile_csv(prof.other, out / f"profile-{tag}-{prof.other.meta['clock']}.csv", force=True)
    prof.steps.to_csv(out / f"profile-{tag}-points.csv", index=False)
    prof.per_request.to_csv(out / f"profile-{tag}-per-request.csv", index=False)
    prof.terms.to_csv(out / f"profile-{tag}-terms.csv", index=False)
    return prof


def time_layouts(g: _Grid) -> None:
    """Flat against padded verification batches (``layouts.csv``)."""
    g.say("timing flat against padded verification batches")
    longest_prompt = max(len(i) for i in g.ids)
    table = layouts_table(
        _STATE["target"].model, longest_prompt, g.cfg.profile_repeats, g.cfg.clock
    )
    _atomic_csv(table, g.cfg.out / "layouts.csv")


def simulated_side(g: _Grid) -> None:
    """The simulated side first (cheap: it sets the open-loop rates), then the real runs'
    specs, repeat-major: every cell once, then every cell again, so that the machine's drift
    over the grid's hour shows in each cell's spread instead of hiding between cells."""
    from specsim.torch_engine.timing import probe_ms

    c = g.cfg
    open_set = set(c.open_drafters if c.open_drafters is not None else c.drafters[:1])
    g.grid = [
        replace(cell, drafter=d)
        for d in c.drafters
        for cell in c.cells
        if cell.concurrency is not None or d in open_set
    ]
    g.sims, g.rates = simulate_grid(g.grid, g.per, c.requests, c.seed)
    model = _STATE["target"].model
    # the probes' speed at profiling time (the profiles were just measured)
    probe_ref = {d: probe_ms(model, PROBE_POINTS, repeats=5, clock=c.clock) for d in c.drafters}
    for cell in g.grid:
        info = g.per[cell.drafter]
        jobs = cell_jobs(cell, c.requests, info["trace"])
        closed = cell.concurrency is not None
        n_rep = c.repeats if closed or c.open_repeats is None else c.open_repeats
        for rep in range(n_rep):
            g.specs.append(
                RunSpec(
                    cell=cell,
                    repeat=rep,
                    jobs=jobs,
                    rate=g.rates.get(cell),
                    seed=c.seed,
                    clock=c.clock,
                    layout=c.layout,
                    prefill_budget=info["cost"].prefill_budget,
                    kv_tokens=info["cost"].kv_tokens,
                    cost=info["cost"],
                    prompt_ids=info["ids"],
                    prompt_len=info["trace"].prompt_len.astype(np.int64),
                    output_len=info["trace"].output_len.astype(np.int64),
                    probe_ref=tuple(probe_ref[cell.drafter]),
                    draft_phase=f"draft:{cell.drafter}",
                )
            )
    g.specs.sort(key=lambda s: s.repeat)


def run_hog_check(g: _Grid) -> None:
    probe = next(
        (s for s in g.specs if s.cell.policy == "mtp1" and s.cell.concurrency == 2),
        g.specs[len(g.specs) // 2],
    )
    where = f"{probe.cell.drafter} {probe.cell.policy} {probe.cell.load}"
    g.say(f"hog check on {where}")
    hog_df = hog_check(probe, os.cpu_count() or 1, g.say)
    hog_df.insert(0, "cell", where)
    _atomic_csv(hog_df, g.cfg.out / "hog.csv")


def real_runs(g: _Grid) -> None:
    c = g.cfg
    spec = ref_spec(g.ref, g.ref_kw) if g.ref is not None else None
    init = (c.target, list(c.drafters), c.device, 1, spec)
    g.results = _execute(g.specs, g.say, c.workers, init)


def write_tables(g: _Grid, table_path: Path) -> pd.DataFrame:
    runs, rows, step_frames, decomp, reqs = assemble(
        g.grid, g.specs, g.results, g.sims, g.per, g.cfg.repeats, g.cfg.clock
    )
    out = g.cfg.out
    table = pd.DataFrame(rows).assign(grid=g.cfg.grid_label)
    _atomic_csv(table, table_path)
    _atomic_csv(pd.DataFrame(runs), out / "runs.csv")
    _atomic_csv(pd.DataFrame(decomp), out / "decomposition.csv")
    _atomic_parquet(pd.concat(step_frames, ignore_index=True), out / "engine_steps.parquet")
    _atomic_parquet(pd.concat(reqs, ignore_index=True), out / "requests.parquet")
    return table


def write_config(g: _Grid, t_start: float, load_start: float) -> None:
    """``config.json``: the ValidationConfig, what the grid resolved, the machine and load,
    where the time went, and the speed reference's work."""
    from specsim.record.models import threads_in_use

    c, per, ref = g.cfg, g.per, g.ref
    config = {
        "validation_config": {
            k: (list(v) if isinstance(v, tuple) else str(v) if isinstance(v, Path) else v)
            for k, v in c.__dict__.items()
        },
        "trace": str(c.trace),
        "traces": {d: str(per[d]["path"]) for d in c.drafters},
        "prompts": list(c.prompts),
        "target": _STATE["target"].name,
        "drafter": per[c.drafters[0]]["name"],
        "drafters": {d: per[d]["name"] for d in c.drafters},
        "policies": sorted({x.policy for x in c.cells}),
        "concurrency": sorted({x.concurrency for x in c.cells if x.concurrency is not None}),
        "rate_fractions": sorted({x.rate_frac for x in c.cells if x.rate_frac is not None}),
        "rates_req_s": {f"{x.drafter} {x.policy} {x.load}": r for x, r in g.rates.items()},
        "requests": c.requests,
        "repeats": c.repeats,
        "clock": c.clock,
        "max_new_tokens": c.max_new_tokens,
        "profile": c.profile or "measured (profile-<drafter>.csv)",
        "profile_table": (
            "shared by the drafters"
            if c.shared_table and len(c.drafters) > 1
            else "one per drafter"
        ),
        "layout": c.layout,
        "seed": c.seed,
        "workers": c.workers,
        "torch_threads": threads_in_use(),
        "cpu_count": os.cpu_count(),
        "loadavg_start": round(load_start, 2),
        "loadavg_end": round(os.getloadavg()[0], 2),
        "elapsed_s": round(time.perf_counter() - t_start, 1),
        "phases_s": g.phases,
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if ref is not None:
        config["speed_reference_ms"] = {k: round(v, 3) for k, v in ref.ref_ms.items()}
        # with workers, their runs' re-timings are counted by the runs (this process's ref
        # did the profiles' and the hog check's)
        away = list(g.results.values()) if c.workers > 1 else []
        config["speed_calibrations"] = ref.calibrations + sum(r["calibrations"] for r in away)
        config["speed_reference_cpu_s"] = round(
            ref.spent_cpu_s + sum(r["probe_cpu_s"] for r in away), 1
        )
        config["speed_every_s"] = ref.every_s
        config["speed_window"] = c.ref_window
        config["speed_probe"] = ref.probe
        config["speed_probe_tokens"] = ref.sizes
        if len(ref.sizes) > 1:
            config["speed_large_every"] = ref.large_every
            config["speed_large_ratio_last"] = round(ref.large_ratio, 4)
            config["speed_ratios_last"] = {p: round(r, 4) for p, r in ref.ratio.items()}
    (c.out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def _same_table(prof: Any, contexts: tuple[int, ...]) -> bool:
    """Whether ``prof``'s step table covers exactly ``contexts`` (the drafters' traces can
    differ in their longest request, and so in the contexts profiled)."""
    return sorted(set(prof.steps["context_tokens"])) == sorted(contexts)


def _check_trace(trace: Any, path: Path, drafter_name: str, ids: list, specs: list[str]) -> None:
    if trace.meta.get("drafter") != drafter_name:
        raise SpecsimError(
            f"{path} was recorded with drafter {trace.meta.get('drafter')!r}, not "
            f"{drafter_name!r}; pass the same --drafter or another --trace"
        )
    if float(trace.meta.get("temperature", "0")) != 0:
        raise SpecsimError(f"{path} is not greedy (temperature 0); validation replays T=0")
    rid = [int(r) for r in trace.request_ids]
    if max(rid) >= len(ids):
        raise SpecsimError(
            f"{path} has request ids up to {max(rid)} but --prompts gives {len(ids)} "
            "prompts; pass the prompts it was recorded on"
        )
    lens = np.array([len(ids[i]) for i in rid])
    if not np.array_equal(lens, trace.prompt_len.astype(np.int64)):
        raise SpecsimError(
            f"{path}'s prompt lengths differ from --prompts {specs}; pass the prompts it was "
            "recorded on"
        )


def _lap(phases: dict[str, float]) -> Any:
    """``lap(name)``: record the wall seconds since the last lap under ``name`` (where a grid's
    time goes: the 45-minute aim of issue 15)."""
    last = [time.perf_counter()]

    def lap(name: str) -> None:
        now = time.perf_counter()
        phases[name] = round(now - last[0], 1)
        last[0] = now

    return lap


def _execute(
    specs: list[RunSpec], say: Any, workers: int = 1, init: tuple | None = None
) -> dict[int, dict[str, Any]]:
    """Run every spec, with a progress bar and ETA: here, one after another (``workers`` 1),
    or in ``workers`` processes, one run each at a time (``init``: :func:`init_worker`'s
    arguments). Beside a neighbour the CPU clock moves by 3-15% (shared caches and memory
    bandwidth; ``--hog-check`` measures it), more than the errors this grid is after, so
    several workers are for the ref clock only, whose probes feel the neighbour too: each
    worker adopts the parent's reference and times its runs in the profile's units."""
    from specsim.progress import Progress

    results: dict[int, dict[str, Any]] = {}
    with Progress(sum(s.jobs for s in specs), "validate", " requests") as bar:
        if workers <= 1:
            done: Any = (run_real(s) for s in specs)
            pool = None
        else:
            import multiprocessing as mp

            # spawn: a fresh interpreter per worker (forking a process that holds torch's
            # thread pools is unsafe); each loads the models and adopts the parent's reference
            pool = mp.get_context("spawn").Pool(workers, init_worker, init)
            done = pool.imap(run_real, specs, chunksize=1)  # in order, as each finishes
        try:
            for i, (s, r) in enumerate(zip(specs, done, strict=True)):
                results[i] = r
                bar.update(s.jobs)
                say(_run_line(s, r))
        finally:
            if pool is not None:
                pool.terminate()
    return results


def _run_line(s: RunSpec, r: dict) -> str:
    m = r["metrics"]
    return (
        f"{s.cell.drafter:>8} {s.cell.policy:>9} {s.cell.load:>11} #{s.repeat}: "
        f"{m['throughput_tok_s']:.2f} tok/s, TPOT {m['tpot_ms_mean']:.1f} ms, tau {m['tau']:.2f} "
        f"({r['wall_s']:.0f} s wall, cpu/wall {r['cpu_s'] / max(r['wall_s'], 1e-9):.3f}, "
        f"probe slowdown {r['slowdown']:.3f}"
        + (f", speed factor {r['speed_factor']:.3f})" if np.isfinite(r["speed_factor"]) else ")")
    )


def _atomic_csv(df: pd.DataFrame, path: Path) -> None:
    from specsim.outputs import atomic

    with atomic(path) as tmp:
        df.to_csv(tmp, index=False, float_format="%.6g")


def _atomic_parquet(df: pd.DataFrame, path: Path) -> None:
    from specsim.outputs import write_table

    write_table(df, path)
