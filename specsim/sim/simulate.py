"""``replay()``: one call from a trace, a policy, a load and a cost profile to tidy results.

Load: exactly one of ``rate`` (open-loop Poisson, or Gamma with ``cv``), ``concurrency``
(closed loop) or ``arrivals`` (an Azure-format CSV or a built-in name); none given means a
closed loop at concurrency 1 (single-user latency: the cleanest view of what speculation buys).
"""

from __future__ import annotations

import contextlib
import os
import time
import warnings
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from specsim.errors import SpecsimError
from specsim.policies.base import Policy, get_policy
from specsim.sim.config import DEFAULT_POLICY, V1_RETIRED, ReplayConfig
from specsim.sim.cost.model import CostModel
from specsim.sim.cost.profiles import get_profile
from specsim.sim.metrics import (
    parse_slo,
    request_frame,
    step_frame,
    summarize,
    token_frame,
)
from specsim.sim.serving import Engine, EngineLimits
from specsim.sim.workload import check_request_count, check_steady_window, make_workload
from specsim.trace.model import Trace


@dataclass(frozen=True, eq=False)
class ReplayResult:
    """``summary`` (dict), ``requests`` (one row per request; None with ``stream=True``),
    ``steps`` (one row per engine step, or None without ``record_steps``), ``tokens`` (one row
    per request-step emission, or None), ``config`` (what was run)."""

    summary: dict
    requests: object  # pandas.DataFrame
    steps: object  # pandas.DataFrame
    config: dict
    tokens: object = None  # pandas.DataFrame | None


def _load_trace(trace: Trace | str | os.PathLike) -> Trace:
    if isinstance(trace, Trace):
        return trace
    from specsim.trace.io import read_trace

    return read_trace(trace)  # a path, or a shipped trace's name (trace.io.resolve_trace)


def _calibrate(trace: Trace, calibrate: str | None, seed: int) -> tuple[Trace, dict]:
    if calibrate is None:
        return trace, {}
    if calibrate != "sts":
        raise SpecsimError(f"unknown calibration {calibrate!r}; the only one is 'sts'")
    from specsim.policies.calibrate import calibrate_trace

    rest, temps = calibrate_trace(trace, seed=seed)
    return rest, {"sts_temperatures": [float(x) for x in temps]}


def _check_closed_duration(tr: Trace, cost: CostModel, c: int, duration: float) -> None:
    """A closed loop bounded by time: refuse before running if it could mean too many requests.

    Upper bound: every step as fast as the profile's one-token step, every draft accepted."""
    fastest_s = float(np.min(cost.step_time(np.array([1]))))
    mean_out = float(np.mean(tr.output_len)) or 1.0
    est = c * duration * (tr.block_size + 1) / (mean_out * max(fastest_s, 1e-9))
    check_request_count(est, f"--concurrency {c} for {duration:g} s")


def _warn_static_beyond_block(policy: str, block: int) -> None:
    """``static:99`` on a 7-token block verifies 7: say so rather than run without a word."""
    name, _, arg = policy.partition(":")
    if name == "static" and arg.isdigit() and int(arg) > block:
        warnings.warn(
            f"{policy} asks for {arg} drafts a step but the trace's blocks hold {block}: it "
            f"verifies {block}, the same as full",
            stacklevel=3,
        )


def replay(
    trace: Trace | str | os.PathLike,
    policy: str | Policy = DEFAULT_POLICY,
    *,
    progress=None,
    **options: Any,
) -> ReplayResult:
    """Replay ``trace`` through the simulated server and return tidy results.

    ``options`` are the fields of :class:`specsim.sim.config.ReplayConfig` (load, server
    capacity, measurement, what is kept), each with its default and meaning there:
    ``rate`` / ``concurrency`` / ``arrivals`` (+ ``cv``), ``requests`` / ``duration``,
    ``profile``, ``max_running`` / ``kv_tokens`` / ``max_batched_tokens`` (default: the
    profile's), ``kv`` / ``kv_block``, ``seed``, ``sla_tps``, ``slo``, ``calibrate="sts"``
    (fit STS on a held-out 30% of the trace's requests and replay the rest),
    ``require_steady``, ``record_steps``, ``record_tokens``, ``stream`` (+
    ``stream_exact_rows``, ``requests_out``). ``serving`` is ``"v2"``, the one serving model:
    ``"v1"`` (or v1's ``prefill_budget``) is refused with a line naming the commit that runs
    it (:data:`specsim.sim.config.V1_RETIRED`).

    Streaming (``stream=True``, :mod:`specsim.sim.streaming`): the summary is accumulated as
    requests finish and no per-request rows are kept (``requests`` is None; ``requests_out``
    writes them to Parquet in row groups instead). Counts, means, SLA/SLO shares and goodput
    are the same to the bit as without it; percentiles too up to ``stream_exact_rows``
    finished requests, and beyond within a DDSketch's relative error (0.5%) of numpy's.

    Memory: by default every step (104 bytes) and every request-step emission (~32 bytes per
    output token: 1.3 GB at 100k requests of 400 tokens) is kept for the ``steps`` and
    ``tokens`` tables; pass ``record_steps=False, record_tokens=False`` (what sweeps do) to keep
    16 bytes a step and get the same summary to the bit.

    A closed loop too short to hold its concurrency for a measured window (fewer than 3C
    requests) runs with an :class:`~specsim.sim.workload.UnsteadyWarning` naming the
    ``requests`` it needs (its steady-state metrics are NaN), or is refused with
    ``require_steady=True`` (what the ``replay`` command does).
    ``progress``: a :class:`specsim.progress.Progress` (or anything with ``update(n)``),
    advanced per completed request.
    """
    if "prefill_budget" in options:  # serving model v1's only option (a saved v1 config)
        raise SpecsimError(V1_RETIRED)
    try:
        cfg = ReplayConfig(**options)
    except TypeError as exc:  # an unknown keyword: name the ones that exist
        known = ", ".join(f.name for f in fields(ReplayConfig))
        raise SpecsimError(f"replay(): {exc}; the options are: {known}") from None
    return _replay(trace, policy, cfg, progress)


def check_summary(summary: dict, load: str, profile: str) -> None:
    """Refuse a run whose headline numbers are impossible, instead of returning them.

    No request finished (a rate so low, or a duration so short, that nothing arrived or
    completed), or simulated time / throughput / latency that is not a finite number (a
    profile's step time so large that the clock overflowed): a table with those in it would
    be read as a result.
    """
    if summary["requests_completed"] == 0:
        raise SpecsimError(
            f"no request completed under {load}; raise --rate, --duration or --requests"
        )
    for key in ("sim_time_s", "throughput_tok_s", "e2e_ms_mean", "ttft_ms_mean"):
        v = summary.get(key)
        if v is None or not np.isfinite(v):
            raise SpecsimError(
                f"the run's {key} is not a finite number ({v}) under {load} with profile "
                f"{profile!r}; check the profile's step times (milliseconds, finite, "
                "reasonable)"
            )


def _stream_sink(cfg: ReplayConfig, tr: Trace, sla_tps, slo_ms, closed_c, stack):  # noqa: ANN001, ANN202
    """(summary accumulator, engine sink) of a streamed run, or (None, None).

    With ``requests_out`` the Parquet file is written under a temporary name entered on
    ``stack`` (renamed into place when the run ends well, removed otherwise)."""
    if not cfg.stream:
        return None, None
    from specsim.outputs import writing
    from specsim.sim.streaming import ParquetRows, RequestSink, StreamConfig, StreamingSummary

    sc = StreamConfig(exact_rows=int(cfg.stream_exact_rows))
    acc = StreamingSummary(sla_tps, slo_ms, closed_c, sc)
    rows = None
    if cfg.requests_out is not None:
        tmp = stack.enter_context(writing(cfg.requests_out))
        rows = ParquetRows(tmp, np.asarray(tr.request_ids), tr.category, sc.row_group)
        stack.callback(rows.abort)  # an open writer is closed even when the run fails
    return acc, RequestSink(acc, rows)


def _replay(trace, policy, cfg: ReplayConfig, progress) -> ReplayResult:  # noqa: ANN001
    rate, concurrency, arrivals, cv = cfg.rate, cfg.concurrency, cfg.arrivals, cfg.cv
    requests, duration, seed, calibrate = cfg.requests, cfg.duration, cfg.seed, cfg.calibrate
    sla_tps, record_steps, record_tokens = cfg.sla_tps, cfg.record_steps, cfg.record_tokens
    max_running, kv_tokens = cfg.max_running, cfg.kv_tokens
    t0 = time.perf_counter()
    tr = _load_trace(trace)
    pol = get_policy(policy)
    cost = get_profile(cfg.profile)
    _warn_static_beyond_block(pol.name, tr.block_size)
    slo_ms = parse_slo(cfg.slo)
    tr, cal = _calibrate(tr, calibrate, seed)
    wl = make_workload(
        tr,
        rate=rate,
        concurrency=concurrency,
        arrivals=arrivals,
        cv=cv,
        requests=requests,
        duration=duration,
        seed=seed,
    )
    if wl.kind == "closed" and wl.max_jobs is None and duration is not None:
        _check_closed_duration(tr, cost, int(wl.concurrency), float(duration))
    if wl.kind == "closed" and wl.max_jobs is not None:
        check_steady_window(int(wl.concurrency), int(wl.max_jobs), requests, cfg.require_steady)
    limits = EngineLimits(
        max_running=int(max_running if max_running is not None else cost.max_running),
        kv_tokens=int(kv_tokens if kv_tokens is not None else cost.kv_tokens),
        kv=cfg.kv,
        kv_block=int(cfg.kv_block),
        max_batched_tokens=int(
            cfg.max_batched_tokens
            if cfg.max_batched_tokens is not None
            else cost.max_batched_tokens
        ),
    )
    if progress is not None and not getattr(progress, "total", 1):
        known = wl.arrival_s.shape[0] if wl.open_loop else wl.max_jobs
        if known:  # a bar made before the load was known learns its total here
            progress.total = float(known)
    closed_c = int(wl.concurrency) if wl.kind == "closed" else None
    with contextlib.ExitStack() as stack:
        streamed, sink = _stream_sink(cfg, tr, sla_tps, slo_ms, closed_c, stack)
        engine = Engine(
            tr,
            pol,
            cost,
            wl,
            limits,
            record_tokens=record_tokens,
            record_steps=record_steps,
            progress=progress,
            seed=seed,
            sink=sink,
            slots=cfg.slots,
        )
        raw = engine.run()
        wall = time.perf_counter() - t0
        summary = summarize(raw, sla_tps, wall, slo_ms, closed_c, cost.gpus, requests=streamed)
        check_summary(summary, wl.describe, cost.name)  # refused: no requests_out is left
    if raw.max_batch_tokens > cost.b_max:
        warnings.warn(
            f"profile {cost.name!r} covers token batches up to {cost.b_max}; this run reached "
            f"{raw.max_batch_tokens}, {cost.beyond_table()}",
            stacklevel=2,
        )
    if cost.meta.get("baseline_lengths"):  # fitted on the user's runs: are they this workload?
        from specsim.sim.cost.baseline import lengths_warning

        far = lengths_warning(cost, tr)
        if far:
            warnings.warn(far, stacklevel=2)
    config = {
        "trace": tr.path or "<in-memory>",
        "trace_requests": tr.n_requests,
        "block_size": tr.block_size,
        "policy": pol.name,
        "zos": bool(pol.zos),
        "load": wl.describe,
        "workload": wl.kind,
        "rate": rate,
        "concurrency": concurrency,
        "arrivals": str(arrivals) if arrivals is not None else None,
        "cv": cv,
        "requests": requests,
        "duration": duration,
        "profile": cost.name,
        "profile_fitted": cost.meta.get("fit_residual"),  # fitted on the user's baseline: how well
        "profile_b_max": cost.b_max,
        "seed": int(seed),
        "sla_tps": sla_tps,
        "slo_ms": slo_ms,
        "calibrate": calibrate,
        "max_running": limits.max_running,
        "kv_tokens": limits.kv_tokens,
        "serving": cfg.serving,
        "kv": cfg.kv,
        "kv_block": limits.kv_block,
        "max_batched_tokens": limits.max_batched_tokens,
        **cal,
    }
    if streamed is not None:
        config["stream"] = {**streamed.describe(), "requests_out": cfg.requests_out}
    cat = tr.category if tr.category is not None else None
    return ReplayResult(
        summary=summary,
        requests=None if cfg.stream else request_frame(raw, np.asarray(tr.request_ids), cat),
        steps=step_frame(raw),
        config=config,
        tokens=token_frame(raw),
    )
