"""Fidelity: the simulator against the real engine, cell by cell, on the same prompts and load.

For each cell (drafter, policy, closed loop at C or open-loop Poisson at a rate) the real engine
(:mod:`specsim.torch_engine.engine`) serves the trace's prompts ``repeats`` times, and the
simulator replays the recorded trace of the same prompts with the same policy, load, job order
(the same seeded workload) and the cost profile measured from the engine's own components
(:mod:`specsim.torch_engine.profile`) on the SAME clock.

Clocks: the engine runs on ``clock`` (``cpu``: a virtual clock of its thread's CPU time, which
the neighbours on a shared machine cannot move much; ``wall``: real time). Every step is also
stamped on the wall clock, so a closed-loop run on the CPU clock yields its wall-clock timeline
too (:func:`retime`: in a closed loop no decision depends on time), and both sides are compared
on both clocks (the wall side against the profile's wall-clock twin). Open-loop cells are
compared on the run's own clock only (arrivals interleave with the clock).

Only torch-free code lives here at import time; the engine is imported lazily.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from specsim.errors import SpecsimError

METRICS = (
    "throughput_tok_s",
    "tpot_ms_mean",
    "tpot_ms_p50",
    "tpot_ms_p90",
    "ttft_ms_p50",
    "ttft_ms_mean",
    "tau",
)
# |relative error| goals (issue 15): throughput and mean TPOT 5% in every cell, p90 TPOT and
# TTFT 10%; the median absolute error of throughput and mean TPOT under 2%
GOAL = {"throughput_tok_s": 0.05, "tpot_ms_mean": 0.05, "tpot_ms_p90": 0.10, "ttft_ms_p50": 0.10}
MEDIAN_GOAL = 0.02
# (context, batch) forwards re-timed before and after every run: their ratio to the same
# forwards timed right after profiling is the machine's speed during the run (a diagnostic)
PROBE_POINTS = ((128, 8),)


@dataclass(frozen=True)
class Cell:
    """One grid cell: closed loop at ``concurrency`` or open loop at ``rate_frac`` of the
    simulated capacity (found per policy from the simulator's closed loop at the largest C)."""

    policy: str
    concurrency: int | None = None
    rate_frac: float | None = None
    drafter: str = ""

    @property
    def load(self) -> str:
        if self.concurrency is not None:
            return f"C={self.concurrency}"
        return f"rate={self.rate_frac:g}x"


@dataclass(frozen=True)
class RunSpec:
    """One real run (picklable: it crosses to a worker process)."""

    cell: Cell
    repeat: int
    jobs: int
    rate: float | None  # req/s (open loop)
    seed: int
    clock: str
    layout: str
    prefill_budget: int
    kv_tokens: int
    cost: Any  # CostModel the policy sees (the clock's profile)
    prompt_ids: list[list[int]]  # per trace request
    prompt_len: np.ndarray
    output_len: np.ndarray
    probe_ref: tuple[float, ...] = ()  # probe ms at profiling time (PROBE_POINTS)
    draft_phase: str = "draft"  # the speed reference's drafter probe (clock ref)


def cell_metrics(summary: dict, requests: pd.DataFrame) -> dict[str, float]:
    """The compared metrics of one run (sim or real), from the shared metric definitions."""
    tpot = requests["tpot_ms"].to_numpy(np.float64)
    tpot = tpot[np.isfinite(tpot)]
    ttft = requests["ttft_ms"].to_numpy(np.float64) if "ttft_ms" in requests else np.array([])
    ttft = ttft[np.isfinite(ttft)]
    return {
        "throughput_tok_s": float(summary["throughput_tok_s"]),
        "tpot_ms_mean": float(summary["tpot_ms_mean"]),
        "tpot_ms_p50": float(np.percentile(tpot, 50)) if tpot.size else float("nan"),
        "tpot_ms_p90": float(np.percentile(tpot, 90)) if tpot.size else float("nan"),
        "ttft_ms_p50": float(np.percentile(ttft, 50)) if ttft.size else float("nan"),
        "ttft_ms_mean": float(summary["ttft_ms_mean"]),
        "tau": float(summary["tau"]),
    }


def compare(real: dict[str, float], sim: dict[str, float]) -> dict[str, float]:
    """Flat row: real_X, sim_X and err_X = (sim - real) / real for every metric."""
    row: dict[str, float] = {}
    for m in METRICS:
        r, s = real[m], sim[m]
        row[f"real_{m}"] = r
        row[f"sim_{m}"] = s
        row[f"err_{m}"] = (s - r) / r if r and np.isfinite(r) and np.isfinite(s) else float("nan")
    return row


def load_adjusted(row: dict, slow: float) -> dict[str, float]:
    """Errors after scaling the simulated times by the machine's measured slowdown during the
    cell (probes against profiling time): a diagnostic column, next to the raw error, never
    instead of it."""
    out = {}
    for m, inverse in (
        ("throughput_tok_s", True),
        ("tpot_ms_mean", False),
        ("tpot_ms_p90", False),
        ("ttft_ms_p50", False),
    ):
        sim = row[f"sim_{m}"] / slow if inverse else row[f"sim_{m}"] * slow
        real = row[f"real_{m}"]
        ok = real and np.isfinite(real) and np.isfinite(sim)
        out[f"adj_err_{m}"] = (sim - real) / real if ok else float("nan")
    return out


def parse_grid(policies: str, concurrency: str, rates: str = "") -> list[Cell]:
    """Cells of the grid: every policy at every closed-loop C and every open-loop rate."""
    pols = [p.strip() for p in policies.split(",") if p.strip()]
    try:
        conc = [int(c) for c in concurrency.split(",") if c.strip()]
    except ValueError:
        raise SpecsimError(
            f"--concurrency must be integers like 1,2,4,8, got {concurrency!r}"
        ) from None
    try:
        fr = [float(r) for r in rates.split(",") if r.strip()]
    except ValueError:
        raise SpecsimError(f"--rates must be fractions like 0.3,0.6,0.9, got {rates!r}") from None
    if not pols or not conc or min(conc) < 1:
        raise SpecsimError("give at least one policy and positive concurrency levels")
    if any(not (0 < f < 2) for f in fr):
        raise SpecsimError(f"--rates are fractions of the simulated capacity in (0, 2): {rates!r}")
    from specsim.policies.base import get_policy

    for p in pols:
        pol = get_policy(p)  # a typo fails now, in one line, not after the profile
        if pol.needs & {"accept_len"}:
            raise SpecsimError(f"policy {p!r} reads the future (an oracle); a real engine cannot")
    cells = [Cell(p, concurrency=c) for p in pols for c in conc]
    return cells + [Cell(p, rate_frac=f) for p in pols for f in fr]


# ------------------------------------------------------------------ one real run


def retime(raw: Any, steps: pd.DataFrame) -> Any:
    """The closed-loop run ``raw`` (on the engine's clock) on the wall clock: every time stamp
    of a closed loop is some step's start or end, so mapping step boundaries maps them all."""
    start = raw.step_log[:, 0]
    end = start + raw.step_log[:, 1]
    virt = np.empty(2 * start.shape[0])
    wall = np.empty_like(virt)
    virt[0::2], virt[1::2] = start, end
    wall[0::2] = steps["wall_start_s"].to_numpy()
    wall[1::2] = steps["wall_end_s"].to_numpy()

    def f(t: np.ndarray | None) -> np.ndarray | None:
        return None if t is None else np.interp(t, virt, wall)

    log = raw.step_log.copy()
    log[:, 0] = wall[0::2]
    log[:, 1] = wall[1::2] - wall[0::2]
    return replace(
        raw,
        arrival_s=f(raw.arrival_s),
        admitted_s=f(raw.admitted_s),
        first_token_s=f(raw.first_token_s),
        finish_s=f(raw.finish_s),
        step_log=log,
        token_time=f(raw.token_time),
        sim_time_s=float(wall[-1]) if wall.size else 0.0,
    )


_STATE: dict[str, Any] = {}


def _init_worker(
    target_spec: str,
    drafters: list[str],
    device: str,
    threads: int,
    ref: dict[str, Any] | None = None,
) -> None:
    """Load the target and every proposer once per process; in a worker of ``--workers`` > 1
    on the ref clock, ``ref`` (:func:`_ref_spec`) gives it the parent's speed reference."""
    from specsim.record.models import load_target, set_threads
    from specsim.torch_engine.proposers import make_proposer

    set_threads(threads)
    target = load_target(target_spec, device)
    _STATE["target"] = target
    _STATE["proposers"] = {d: make_proposer(d, target)[0] for d in drafters}
    if ref is not None:
        from specsim.torch_engine.clock import use_reference
        from specsim.torch_engine.speed import speed_reference

        use_reference(
            speed_reference(
                target.model,
                {f"draft:{d}": _STATE["proposers"][d] for d in drafters},
                like=(ref["ref_ms"], ref["repeat_k"]),
                **ref["kw"],
            )
        )


def _ref_spec(ref: Any, kw: dict[str, Any]) -> dict[str, Any]:
    """What a worker process needs to rebuild the parent's speed reference: the reference
    times, the cheap drafters' call counts and ``speed_reference``'s arguments."""
    return {"ref_ms": dict(ref.ref_ms), "repeat_k": dict(ref.repeat_k), "kw": dict(kw)}


def run_real(spec: RunSpec) -> dict[str, Any]:
    """One real run of a cell: metrics on the engine's clock (and, closed loop, on the wall
    clock), the step log, and how many jobs' lengths differ from the trace."""
    from specsim.policies.base import get_policy
    from specsim.sim.metrics import request_frame, summarize
    from specsim.sim.workload import TraceLengths, synthetic
    from specsim.torch_engine.engine import EngineConfig, RealEngine

    target = _STATE["target"]
    proposer = _STATE["proposers"][spec.cell.drafter]
    lengths = TraceLengths(spec.prompt_len, spec.output_len)
    c = spec.cell
    if c.concurrency is not None:
        wl = synthetic(lengths, concurrency=c.concurrency, requests=spec.jobs, seed=spec.seed)
        slots = c.concurrency
    else:
        wl = synthetic(lengths, rate=spec.rate, requests=spec.jobs, seed=spec.seed)
        slots = spec.jobs
    cfg = EngineConfig(
        seed=spec.seed,
        layout=spec.layout,
        max_running=slots,
        kv_tokens=spec.kv_tokens,
        prefill_budget=spec.prefill_budget,
        eos_ids=tuple(target.eos_ids),
        clock=spec.clock,
        draft_phase=spec.draft_phase,
    )
    from specsim.torch_engine.clock import active_reference
    from specsim.torch_engine.profile import probe_ms

    ref = active_reference()
    n0, p0 = (ref.calibrations, ref.spent_cpu_s) if ref is not None else (0, 0.0)
    before = probe_ms(target.model, PROBE_POINTS, clock=spec.clock)
    c0, w0 = time.thread_time(), time.perf_counter()
    real = RealEngine(
        target.model, proposer, get_policy(c.policy), spec.cost, spec.prompt_ids, wl, cfg
    ).run()
    cpu_s, wall_s = time.thread_time() - c0, time.perf_counter() - w0
    after = probe_ms(target.model, PROBE_POINTS, clock=spec.clock)
    slow = float("nan")
    if spec.probe_ref:
        slow = float(np.mean((np.add(before, after) / 2) / np.asarray(spec.probe_ref)))
    out: dict[str, Any] = {
        "metrics": cell_metrics(real.summary, real.requests),
        "cpu_s": cpu_s,
        "wall_s": wall_s,
        "slowdown": slow,
        # ref clock: the run's raw CPU seconds over its reference seconds (> 1: slower)
        "speed_factor": float(real.config.get("speed_factor", np.nan)),
        "job_trace": real.raw.job_trace,
        "output_len": real.raw.output_len,
        "steps": real.steps,
        "requests": real.requests,
        "engine_steps": int(real.summary["engine_steps"]),
        # the speed reference's re-timings during the run (ref clock), for config.json
        "calibrations": (ref.calibrations - n0) if ref is not None else 0,
        "probe_cpu_s": (ref.spent_cpu_s - p0) if ref is not None else 0.0,
    }
    if c.concurrency is not None and spec.clock != "wall":
        raw_w = retime(real.raw, real.steps)
        ids = np.arange(len(spec.prompt_ids), dtype=np.int64)
        out["wall_metrics"] = cell_metrics(
            summarize(raw_w, None, raw_w.sim_time_s), request_frame(raw_w, ids, None)
        )
    elif spec.clock == "wall":
        out["wall_metrics"] = out["metrics"]
    return out


# ------------------------------------------------------------------ hog check


def _spin() -> None:  # a CPU hog: pure Python, little memory traffic
    x = 0
    while True:
        x += 1


def _stream() -> None:  # a memory hog: streams 64 MB arrays through the caches
    a = np.ones(8_000_000)
    b = np.empty_like(a)
    while True:
        np.copyto(b, a)
        a, b = b, a


def hog_check(spec: RunSpec, hogs: int, log: Any = None) -> pd.DataFrame:
    """The same real run quiet, beside ``hogs`` CPU-spinning processes, and beside ``hogs``
    memory-streaming processes (started and stopped here): how far each clock moves."""
    import multiprocessing as mp

    # fork where there is one: a hog needs nothing of the parent, and spawn re-imports __main__
    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    rows = []
    for cond, fn in (("quiet", None), ("cpu hog", _spin), ("memory hog", _stream)):
        procs = [ctx.Process(target=fn, daemon=True) for _ in range(hogs if fn else 0)]
        for p in procs:
            p.start()
        if procs:
            time.sleep(1.0)  # let them spin up
        try:
            res = run_real(spec)
        finally:
            for p in procs:
                p.terminate()
                p.join()
        pairs = [(spec.clock if spec.clock != "wall" else "cpu", res["metrics"])]
        if spec.clock == "ref":  # the raw CPU clock of the same run: ref x the run's factor
            f = res["speed_factor"]
            m = res["metrics"]
            pairs.append(("cpu", {"throughput_tok_s": m["throughput_tok_s"] / f,
                                  "tpot_ms_mean": m["tpot_ms_mean"] * f,
                                  "ttft_ms_p50": m["ttft_ms_p50"] * f}))  # fmt: skip
        pairs.append(("wall", res.get("wall_metrics") or {}))
        for clk, m in pairs:
            rows.append(
                {
                    "condition": cond,
                    "hog_processes": len(procs),
                    "clock": clk,
                    "throughput_tok_s": m.get("throughput_tok_s", np.nan),
                    "tpot_ms_mean": m.get("tpot_ms_mean", np.nan),
                    "ttft_ms_p50": m.get("ttft_ms_p50", np.nan),
                }
            )
        if log:
            log(f"hog check: {cond}: {res['metrics']['throughput_tok_s']:.2f} tok/s ({spec.clock})")
    df = pd.DataFrame(rows)
    for clk in df["clock"].unique():
        sel = df["clock"] == clk
        q = df.loc[sel & (df["condition"] == "quiet"), "throughput_tok_s"].iloc[0]
        df.loc[sel, "throughput_vs_quiet"] = df.loc[sel, "throughput_tok_s"] / q - 1.0
    return df


# ------------------------------------------------------------------ the grid


def run_validation(**kw: Any) -> pd.DataFrame:
    """Run the grid; write table, runs, step logs, profiles, decomposition and config under
    ``out_dir`` (see :func:`_run_validation` for the arguments). With ``clock="ref"`` the
    process's speed reference is set for the run and cleared after it."""
    from specsim.torch_engine.clock import use_reference

    try:
        return _run_validation(**kw)
    finally:
        use_reference(None)


def _same_table(prof: Any, contexts: tuple[int, ...]) -> bool:
    """Whether ``prof``'s step table covers exactly ``contexts`` (the drafters' traces can
    differ in their longest request, and so in the contexts profiled)."""
    return sorted(set(prof.steps["context_tokens"])) == sorted(contexts)


def _run_validation(
    *,
    trace_path: Path,
    prompt_specs: list[str],
    cells: list[Cell],
    out_dir: Path,
    target_spec: str = "smollm2",
    drafters: tuple[str, ...] = ("ngram",),
    requests: int | None = None,
    max_new_tokens: int = 64,
    profile: str | None = None,
    profile_contexts: tuple[int, ...] = (64, 256, 512),
    profile_batches: tuple[int, ...] | None = None,
    profile_repeats: int = 5,
    repeats: int = 1,
    open_repeats: int | None = None,
    open_drafters: tuple[str, ...] | None = None,
    layout: str = "flat",
    seed: int = 0,
    prefill_budget: int = 16384,
    clock: str = "cpu",
    ref_every_s: float = 1.0,
    ref_window: int = 1,
    ref_probe: str = "cold",
    ref_large: int = 64,
    ref_large_every: int = 4,
    ref_mid: int = 0,
    shared_table: bool = True,
    hogs: int = 0,
    workers: int = 1,
    force: bool = False,
    device: str = "cpu",
    log: Any = None,
) -> pd.DataFrame:
    """Run the grid; write table, runs, step logs, profiles, decomposition and config under
    ``out_dir``. ``trace_path`` may hold ``{drafter}`` (one trace per drafter)."""
    from specsim.record.models import prompt_ids
    from specsim.record.prompts import load_many
    from specsim.sim.profiles import get_profile, write_profile_csv
    from specsim.torch_engine.clock import check_clock
    from specsim.trace.io import read_trace

    say = log or (lambda msg: None)
    check_clock(clock, device, 1)
    if len(drafters) > 1 and "{drafter}" not in str(trace_path):
        raise SpecsimError(
            "several --drafters need one trace each: put {drafter} in --trace, e.g. "
            "reports/fidelity/trace-{drafter}.parquet"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    table_path = out_dir / "fidelity.csv"
    if table_path.exists() and not force:
        raise SpecsimError(f"{table_path} exists; pass --force to overwrite it")
    t_start = time.perf_counter()
    load_start = os.getloadavg()[0]
    _init_worker(target_spec, list(drafters), device, 1)
    target = _STATE["target"]
    phases: dict[str, float] = {}  # wall seconds by part of the grid (config.json)
    lap = _lap(phases)
    lap("loading the models")
    ref = None
    if clock == "ref":  # one reference for the profiles and every run: the same units
        from specsim.torch_engine.clock import use_reference
        from specsim.torch_engine.speed import speed_reference

        say("taking the speed reference (a target forward, each drafter's proposal)")
        ref_kw = {
            "every_s": ref_every_s,
            "window": ref_window,
            "probe": ref_probe,
            "large_tokens": ref_large,
            "large_every": ref_large_every,
            "mid_tokens": ref_mid,
        }
        ref = speed_reference(
            target.model, {f"draft:{d}": _STATE["proposers"][d] for d in drafters}, **ref_kw
        )
        use_reference(ref)
        lap("speed reference")
    prompts = load_many(prompt_specs)
    ids = [prompt_ids(target.tokenizer, p.text) for p in prompts]
    per: dict[str, dict[str, Any]] = {}
    shared = None  # with shared_table: the first drafter's profile, whose table the rest reuse
    for d in drafters:
        from specsim.torch_engine.proposers import make_proposer

        proposer, drafter_name = make_proposer(d, target)
        path = Path(str(trace_path).replace("{drafter}", d.replace(":", "")))
        if not path.exists():
            say(f"recording {path} ({len(prompts)} prompts, {max_new_tokens} new tokens)")
            _record(target, proposer, drafter_name, prompts, path, max_new_tokens, seed)
        trace = read_trace(path)
        _check_trace(trace, path, drafter_name, ids, prompt_specs)
        by_trace = [ids[int(i)] for i in trace.request_ids]
        lens = np.array([len(p) for p in by_trace])
        if profile:
            cost = get_profile(profile)
            other = None
        else:
            from specsim.policies.base import get_policy
            from specsim.torch_engine.profile import DEFAULT_B, measure_profile

            say(f"measuring the engine's cost profile with drafter {d} ({clock} clock)")
            longest = int(lens.max() + trace.output_len.max())
            grid = sorted(profile_contexts)
            ctxs = tuple(c for c in grid if c < longest)
            ctxs += tuple(c for c in grid if c >= longest)[:1]
            prof = measure_profile(
                target.model,
                proposer,
                get_policy("hw-aware"),
                name=f"engine-{target.name}-{d.replace(':', '')}",
                batch_tokens=profile_batches or DEFAULT_B,
                contexts=ctxs,
                requests=tuple(sorted({1, 2, 4, 8, min(_max_c(cells), 16)})),
                draft_context=int(np.median(lens + trace.output_len // 2)),
                repeats=profile_repeats,
                layout=layout,
                seed=seed,
                limits={"prefill_budget": prefill_budget},
                clock=clock,
                draft_phase=f"draft:{d}",
                table=shared if shared is not None and _same_table(shared, ctxs) else None,
                table_repeats=profile_repeats * len(drafters) if shared_table else None,
            )
            if shared_table and shared is None:
                shared = prof
            cost, other = prof.cost, prof.other
            tag = d.replace(":", "")
            write_profile_csv(cost, out_dir / f"profile-{tag}.csv", force=True)
            twin = out_dir / f"profile-{tag}-{other.meta['clock']}.csv"
            write_profile_csv(other, twin, force=True)
            prof.steps.to_csv(out_dir / f"profile-{tag}-points.csv", index=False)
            prof.per_request.to_csv(out_dir / f"profile-{tag}-per-request.csv", index=False)
            prof.terms.to_csv(out_dir / f"profile-{tag}-terms.csv", index=False)
        per[d] = {
            "name": drafter_name,
            "trace": trace,
            "path": path,
            "ids": by_trace,
            "cost": cost,
            "other": other,
        }
    lap("traces and profiles")
    if not profile:
        say("timing flat against padded verification batches")
        longest_prompt = max(len(i) for i in ids)
        _atomic_csv(
            layouts_table(target.model, longest_prompt, profile_repeats, clock),
            out_dir / "layouts.csv",
        )
    open_set = set(open_drafters if open_drafters is not None else drafters[:1])
    grid = [
        replace(c, drafter=d)
        for d in drafters
        for c in cells
        if c.concurrency is not None or d in open_set
    ]
    # -- the simulated side first (cheap): capacities for the open-loop rates, run lengths
    sims, rates = _simulate_grid(grid, per, requests, seed)
    from specsim.torch_engine.profile import probe_ms

    probe_pts = PROBE_POINTS
    probe_ref = {
        d: probe_ms(target.model, probe_pts, repeats=5, clock=clock) for d in drafters
    }  # the probes' speed at profiling time (the profiles were just measured)
    specs = []
    for c in grid:
        info = per[c.drafter]
        jobs = _jobs(c, requests, info["trace"])
        n_rep = repeats if c.concurrency is not None or open_repeats is None else open_repeats
        for rep in range(n_rep):
            specs.append(
                RunSpec(
                    cell=c,
                    repeat=rep,
                    jobs=jobs,
                    rate=rates.get(c),
                    seed=seed,
                    clock=clock,
                    layout=layout,
                    prefill_budget=info["cost"].prefill_budget,
                    kv_tokens=info["cost"].kv_tokens,
                    cost=info["cost"],
                    prompt_ids=info["ids"],
                    prompt_len=info["trace"].prompt_len.astype(np.int64),
                    output_len=info["trace"].output_len.astype(np.int64),
                    probe_ref=tuple(probe_ref[c.drafter]),
                    draft_phase=f"draft:{c.drafter}",
                )
            )
    # repeat-major: every cell once, then every cell again, so that the machine's drift over
    # the grid's hour shows in each cell's spread instead of hiding between cells
    specs.sort(key=lambda s: s.repeat)
    lap("layouts and the simulated side")
    hog_df = None
    if hogs:
        probe = next(
            (s for s in specs if s.cell.policy == "mtp1" and s.cell.concurrency == 2),
            specs[len(specs) // 2],
        )
        say(f"hog check on {probe.cell.drafter} {probe.cell.policy} {probe.cell.load}")
        hog_df = hog_check(probe, hogs, say)
        hog_df.insert(0, "cell", f"{probe.cell.drafter} {probe.cell.policy} {probe.cell.load}")
        _atomic_csv(hog_df, out_dir / "hog.csv")
        lap("hog check")
    ref_spec = _ref_spec(ref, ref_kw) if ref is not None else None
    init = (target_spec, list(drafters), device, 1, ref_spec)
    results = _execute(specs, say, workers, init)
    lap(f"{len(specs)} real runs")
    runs, rows, step_frames, decomp, reqs = _assemble(
        grid, specs, results, sims, per, repeats, clock
    )
    table = pd.DataFrame(rows)
    _atomic_csv(table, table_path)
    _atomic_csv(pd.DataFrame(runs), out_dir / "runs.csv")
    _atomic_csv(pd.DataFrame(decomp), out_dir / "decomposition.csv")
    _atomic_parquet(pd.concat(step_frames, ignore_index=True), out_dir / "engine_steps.parquet")
    _atomic_parquet(pd.concat(reqs, ignore_index=True), out_dir / "requests.parquet")
    from specsim.record.models import threads_in_use

    config = {
        "trace": str(trace_path),
        "traces": {d: str(per[d]["path"]) for d in drafters},
        "prompts": prompt_specs,
        "target": target.name,
        "drafter": per[drafters[0]]["name"],
        "drafters": {d: per[d]["name"] for d in drafters},
        "policies": sorted({c.policy for c in cells}),
        "concurrency": sorted({c.concurrency for c in cells if c.concurrency is not None}),
        "rate_fractions": sorted({c.rate_frac for c in cells if c.rate_frac is not None}),
        "rates_req_s": {f"{c.drafter} {c.policy} {c.load}": r for c, r in rates.items()},
        "requests": requests,
        "repeats": repeats,
        "clock": clock,
        "max_new_tokens": max_new_tokens,
        "profile": profile or "measured (profile-<drafter>.csv)",
        "profile_table": (
            "shared by the drafters" if shared_table and len(drafters) > 1 else "one per drafter"
        ),
        "layout": layout,
        "seed": seed,
        "workers": workers,
        "torch_threads": threads_in_use(),
        "cpu_count": os.cpu_count(),
        "loadavg_start": round(load_start, 2),
        "loadavg_end": round(os.getloadavg()[0], 2),
        "elapsed_s": round(time.perf_counter() - t_start, 1),
        "phases_s": phases,
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if ref is not None:
        config["speed_reference_ms"] = {k: round(v, 3) for k, v in ref.ref_ms.items()}
        # with workers, their runs' re-timings are counted by the runs (this process's ref
        # did the profiles' and the hog check's)
        away = list(results.values()) if workers > 1 else []
        config["speed_calibrations"] = ref.calibrations + sum(r["calibrations"] for r in away)
        config["speed_reference_cpu_s"] = round(
            ref.spent_cpu_s + sum(r["probe_cpu_s"] for r in away), 1
        )
        config["speed_every_s"] = ref.every_s
        config["speed_window"] = ref_window
        config["speed_probe"] = ref.probe
        config["speed_probe_tokens"] = ref.sizes
        if len(ref.sizes) > 1:
            config["speed_large_every"] = ref.large_every
            config["speed_large_ratio_last"] = round(ref.large_ratio, 4)
            config["speed_ratios_last"] = {p: round(r, 4) for p, r in ref.ratio.items()}
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return table


def layouts_table(model: Any, prompt_len: int, repeats: int, clock: str = "wall") -> pd.DataFrame:
    """Flat against padded verification: decode-only batches and a batch with a prefill."""
    from specsim.torch_engine.profile import compare_layouts

    shapes = {
        "8 decodes, 1-8 tokens": (1, 3, 5, 8, 2, 6, 1, 4),
        "4 decodes of 8 tokens": (8, 8, 8, 8),
        "1 prefill + 3 decodes": (prompt_len, 1, 4, 8),
    }
    rows = []
    for name, lens in shapes.items():
        r = compare_layouts(model, lens, repeats=repeats, clock=clock)
        rows.append(
            {
                "batch": name,
                "tokens": int(r["tokens"]),
                "padded_rows": int(r["padded_rows"]),
                "flat_ms": r["flat"],
                "padded_ms": r["padded"],
                "padded_over_flat": r["padded"] / r["flat"],
            }
        )
    return pd.DataFrame(rows)


def _max_c(cells: list[Cell]) -> int:
    return max((c.concurrency for c in cells if c.concurrency is not None), default=8)


def _jobs(c: Cell, requests: int | None, trace: Any) -> int:
    n = requests or trace.n_requests
    return max(n, c.concurrency or 0)


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


def _simulate_grid(grid: list[Cell], per: dict, requests: int | None, seed: int):  # type: ignore[no-untyped-def]
    """Simulated metrics of every cell on both clocks, and the open-loop rates (req/s): a
    fraction of the policy's simulated capacity (closed loop at the grid's largest C)."""
    from specsim.sim.simulate import replay

    c_max = max((c.concurrency for c in grid if c.concurrency is not None), default=8)
    rates: dict[Cell, float] = {}
    sims: dict[Cell, dict[str, Any]] = {}
    for c in grid:
        info = per[c.drafter]
        tr, jobs = info["trace"], _jobs(c, requests, info["trace"])
        kw: dict[str, Any] = {"requests": jobs, "seed": seed, "record_tokens": False}
        if c.concurrency is not None:
            kw["concurrency"] = c.concurrency
        else:
            cap = replay(tr, c.policy, concurrency=c_max, profile=info["cost"], **kw)
            per_job = float(np.mean(tr.output_len))
            rates[c] = round(c.rate_frac * cap.summary["throughput_tok_s"] / per_job, 4)
            kw["rate"] = rates[c]
        res = replay(tr, c.policy, profile=info["cost"], **kw)
        entry = {
            "metrics": cell_metrics(res.summary, res.requests),
            "requests": res.requests,
            "sim_time_s": 0.0,
        }
        entry["sim_time_s"] = float(res.summary["sim_time_s"])
        if info["other"] is not None and c.concurrency is not None:
            res_w = replay(tr, c.policy, profile=info["other"], **kw)
            entry["wall_metrics"] = cell_metrics(res_w.summary, res_w.requests)
        sims[c] = entry
    return sims, rates


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
    or in ``workers`` processes, one run each at a time (``init``: :func:`_init_worker`'s
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
            pool = mp.get_context("spawn").Pool(workers, _init_worker, init)
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


def _assemble(grid, specs, results, sims, per, repeats, clock):  # type: ignore[no-untyped-def]
    """Per-run rows, per-cell rows (real mean and spread against sim, both clocks), step logs,
    the per-step decomposition and every request's timeline (real runs and simulation)."""
    runs, rows, frames, decomp, reqs = [], [], [], [], []
    by_cell: dict[Cell, list[int]] = {}
    for i, s in enumerate(specs):
        by_cell.setdefault(s.cell, []).append(i)
    for c in grid:
        idx = sorted(by_cell[c], key=lambda i: specs[i].repeat)
        res = [results[i] for i in idx]
        info = per[c.drafter]
        want = info["trace"].output_len
        mism = int(sum(np.sum(r["output_len"] != want[r["job_trace"]]) for r in res))
        for i, r in zip(idx, res, strict=True):
            runs.append(
                {
                    "drafter": c.drafter,
                    "policy": c.policy,
                    "load": c.load,
                    "repeat": specs[i].repeat,
                    **{f"{clock}_{k}": v for k, v in r["metrics"].items()},
                    **{f"wall_{k}": v for k, v in (r.get("wall_metrics") or {}).items()},
                    "run_cpu_s": r["cpu_s"],
                    "run_wall_s": r["wall_s"],
                    "slowdown": r["slowdown"],
                    "speed_factor": r["speed_factor"],
                }
            )
            st = r["steps"].copy()
            st.insert(0, "repeat", specs[i].repeat)
            st.insert(0, "load", c.load)
            st.insert(0, "concurrency", c.concurrency if c.concurrency is not None else -1)
            st.insert(0, "policy", c.policy)
            st.insert(0, "drafter", c.drafter)
            frames.append(st)
            reqs.append(_request_rows(c, "real", specs[i].repeat, r.get("requests")))
        real = {m: float(np.mean([r["metrics"][m] for r in res])) for m in METRICS}
        row: dict[str, Any] = {
            "drafter": c.drafter,
            "policy": c.policy,
            "load": c.load,
            "concurrency": c.concurrency if c.concurrency is not None else -1,
            "rate_frac": c.rate_frac if c.rate_frac is not None else np.nan,
            "jobs": specs[idx[0]].jobs,
            "repeats": len(res),
            "length_mismatch": mism,
            **compare(real, sims[c]["metrics"]),
        }
        for m in ("throughput_tok_s", "tpot_ms_mean", "tpot_ms_p90", "ttft_ms_p50"):
            vals = np.array([r["metrics"][m] for r in res])
            row[f"spread_{m}"] = float((vals.max() - vals.min()) / vals.mean())
        if "wall_metrics" in res[0] and "wall_metrics" in sims[c]:
            wreal = {m: float(np.mean([r["wall_metrics"][m] for r in res])) for m in METRICS}
            wrow = compare(wreal, sims[c]["wall_metrics"])
            row.update({f"wall_{k}": v for k, v in wrow.items()})
        slow = float(np.mean([r["slowdown"] for r in res]))
        row["slowdown_vs_profile"] = slow
        row["speed_factor"] = float(np.mean([r["speed_factor"] for r in res]))
        row.update(load_adjusted(row, slow))
        row["real_steps"] = int(res[0]["engine_steps"])
        row["cpu_over_wall"] = float(np.mean([r["cpu_s"] / r["wall_s"] for r in res]))
        rows.append(row)
        decomp.append(_decompose(c, res[0]["steps"], info["cost"], info["trace"]))
        reqs.append(_request_rows(c, "sim", -1, sims[c].get("requests")))
    return runs, rows, frames, decomp, reqs


REQUEST_COLS = ("id", "prompt_len", "arrival_s", "admitted_s", "first_token_s", "ttft_ms")


def _request_rows(c: Cell, side: str, repeat: int, frame: Any) -> pd.DataFrame:
    """A run's (or the simulation's, ``repeat`` -1) requests, tagged with their cell: where a
    request's TTFT went, queued (arrival to admission) or prefilling (admission to its first
    token), real against simulated (``fidelity_report.ttft_misses_markdown``)."""
    if frame is None:
        return pd.DataFrame()
    out = frame[list(REQUEST_COLS)].copy()
    for k, v in (("repeat", repeat), ("side", side), ("load", c.load), ("policy", c.policy)):
        out.insert(0, k, v)
    out.insert(0, "drafter", c.drafter)
    return out


def _decompose(c: Cell, steps: pd.DataFrame, cost: Any, trace: Any) -> dict[str, Any]:
    """Mean ms per decode-only step, real against the cost model's terms at the same steps
    (same batch, requests and context): which term differs."""
    st = steps[(steps["prefilling"] == 0) & (steps["decoding"] > 0)]
    out: dict[str, Any] = {"drafter": c.drafter, "policy": c.policy, "load": c.load}
    if st.empty:
        return out
    n = st["decoding"].to_numpy(np.float64)
    ctx = st["ctx_mean"].to_numpy(np.float64)
    b = st["batch_tokens"].to_numpy(np.int64)
    gamma = int(trace.block_size)
    win = cost.draft_context_window or np.inf
    m_draft = cost.draft_ms(n, gamma) + cost.draft_per_context_us * 1e-3 * n * np.minimum(
        ctx - 1, win
    )
    m_table = np.array([cost.step_time(int(x), float(y)) for x, y in zip(b, ctx, strict=True)])
    m_table *= 1000.0
    m_over = cost.overhead_ms(n) + cost.accept_per_token_ms * b
    real_loop = st["duration_s"] - st["draft_s"] - st["sched_s"] - st["verify_s"]
    out.update(
        {
            "steps": len(st),
            "real_draft_ms": 1000 * st["draft_s"].mean(),
            "model_draft_ms": float(m_draft.mean()),
            "real_sched_ms": 1000 * st["sched_s"].mean(),
            "real_forward_ms": 1000 * st["verify_s"].mean(),
            "model_table_ms": float(m_table.mean()),
            "real_loop_ms": 1000 * float(real_loop.mean()),
            "model_overhead_ms": float(m_over.mean()),
            "real_step_ms": 1000 * st["duration_s"].mean(),
            "model_step_ms": float((m_draft + m_table + m_over).mean()),
        }
    )
    return out


def _record(target, proposer, name, prompts, path, max_new_tokens, seed) -> None:  # type: ignore[no-untyped-def]
    from specsim.record.recorder import RecordConfig, record

    drafter = getattr(proposer, "drafter", None)
    if drafter is None:  # n-gram
        from specsim.record.ngram import NgramDrafter

        drafter = NgramDrafter(n=proposer.n, block_size=proposer.gamma)
    path.parent.mkdir(parents=True, exist_ok=True)
    record(
        target, drafter, name, prompts, path, RecordConfig(max_new_tokens=max_new_tokens, seed=seed)
    )


def _atomic_csv(df: pd.DataFrame, path: Path) -> None:
    from specsim.outputs import atomic

    with atomic(path) as tmp:
        df.to_csv(tmp, index=False, float_format="%.6g")


def _atomic_parquet(df: pd.DataFrame, path: Path) -> None:
    from specsim.outputs import write_table

    write_table(df, path)


def fidelity_lines(table: pd.DataFrame) -> str:
    """One line per cell for the terminal."""
    return "\n".join(
        f"{r.drafter:>8} {r.policy:>9} {r.load:>11}: throughput "
        f"{100 * r.err_throughput_tok_s:+.1f}% (spread {100 * r.spread_throughput_tok_s:.1f}%), "
        "mean TPOT "
        f"{100 * r.err_tpot_ms_mean:+.1f}%, p90 TPOT {100 * r.err_tpot_ms_p90:+.1f}%, p50 TTFT "
        f"{100 * r.err_ttft_ms_p50:+.1f}%, tau {r.real_tau:.2f}/{r.sim_tau:.2f}"
        for r in table.itertuples()
    )
