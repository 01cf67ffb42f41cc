"""The real side of a fidelity grid: one run of specsim's torch engine on a cell (and the
hog check, and the flat-against-padded layout timing). torch is imported inside the functions:
this module is picklable work for worker processes."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pandas as pd

from specsim.fidelity.config import RunSpec
from specsim.fidelity.metrics import cell_metrics, retime

# (context, batch) forwards re-timed before and after every run: their ratio to the same
# forwards timed right after profiling is the machine's speed during the run (a diagnostic)
PROBE_POINTS = ((128, 8),)


_STATE: dict[str, Any] = {}


def init_worker(
    target_spec: str,
    drafters: list[str],
    device: str,
    threads: int,
    ref: dict[str, Any] | None = None,
) -> None:
    """Load the target and every proposer once per process; in a worker of ``--workers`` > 1
    on the ref clock, ``ref`` (:func:`ref_spec`) gives it the parent's speed reference."""
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


def ref_spec(ref: Any, kw: dict[str, Any]) -> dict[str, Any]:
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
    from specsim.torch_engine.timing import probe_ms

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


def layouts_table(model: Any, prompt_len: int, repeats: int, clock: str = "wall") -> pd.DataFrame:
    """Flat against padded verification: decode-only batches and a batch with a prefill."""
    from specsim.torch_engine.timing import compare_layouts

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


def record_trace_for(target, proposer, name, prompts, path, max_new_tokens, seed) -> None:  # type: ignore[no-untyped-def]
    from specsim.record.recorder import RecordConfig, record

    drafter = getattr(proposer, "drafter", None)
    if drafter is None:  # n-gram
        from specsim.record.ngram import NgramDrafter

        drafter = NgramDrafter(n=proposer.n, block_size=proposer.gamma)
    path.parent.mkdir(parents=True, exist_ok=True)
    record(
        target, drafter, name, prompts, path, RecordConfig(max_new_tokens=max_new_tokens, seed=seed)
    )
