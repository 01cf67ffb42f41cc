"""``replay()``: one call from a trace, a policy, a load and a cost profile to tidy results.

Load: exactly one of ``rate`` (open-loop Poisson, or Gamma with ``cv``), ``concurrency``
(closed loop) or ``arrivals`` (an Azure-format CSV or a built-in name); none given means a
closed loop at concurrency 1 (single-user latency: the cleanest view of what speculation buys).
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass

import numpy as np

from specsim.errors import SpecsimError
from specsim.policies.base import Policy, get_policy
from specsim.sim.cost import CostModel
from specsim.sim.engine import Engine, EngineLimits
from specsim.sim.metrics import parse_slo, request_frame, step_frame, summarize, token_frame
from specsim.sim.profiles import get_profile
from specsim.sim.workload import check_request_count, make_workload
from specsim.trace.model import Trace


@dataclass(frozen=True, eq=False)
class ReplayResult:
    """``summary`` (dict), ``requests`` (one row per request), ``steps`` (one row per engine
    step, or None without ``record_steps``), ``tokens`` (one row per request-step emission, or
    None), ``config`` (what was run)."""

    summary: dict
    requests: object  # pandas.DataFrame
    steps: object  # pandas.DataFrame
    config: dict
    tokens: object = None  # pandas.DataFrame | None


def _load_trace(trace: Trace | str | os.PathLike) -> Trace:
    if isinstance(trace, Trace):
        return trace
    path = str(trace)
    if not os.path.exists(path):
        raise SpecsimError(f"trace file {path!r} does not exist; record or synthesise one first")
    try:
        from specsim.trace.io import read_trace
    except ImportError:  # pragma: no cover - the trace I/O module ships with specsim
        raise SpecsimError("specsim.trace.io is missing; reinstall specsim") from None
    return read_trace(path)


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


def replay(
    trace: Trace | str | os.PathLike,
    policy: str | Policy = "hw-aware",
    *,
    rate: float | None = None,
    concurrency: int | None = None,
    arrivals: str | os.PathLike | None = None,
    cv: float | None = None,
    requests: int | None = None,
    duration: float | None = None,
    profile: str | CostModel = "h100-dense-8b",
    seed: int = 0,
    sla_tps: float | None = None,
    slo: str | dict[str, float] | None = None,
    calibrate: str | None = None,
    max_running: int | None = None,
    kv_tokens: int | None = None,
    prefill_budget: int | None = None,
    record_tokens: bool = True,
    record_steps: bool = True,
    progress=None,
) -> ReplayResult:
    """Replay ``trace`` through the simulated server and return tidy results.

    ``max_running`` / ``kv_tokens`` / ``prefill_budget`` default to the profile's (header keys
    of the same names).
    ``calibrate="sts"`` fits STS on a held-out 30% of the trace's requests and replays the
    rest with calibrated confidences. ``progress``: a :class:`specsim.progress.Progress` (or
    anything with ``update(n)``), advanced per completed request. ``record_steps=False``
    keeps only what the summary needs of the step log (16 bytes a step instead of 104; same
    summary to the bit) and leaves ``steps`` None: for sweeps, which read the summary only.
    """
    t0 = time.perf_counter()
    tr = _load_trace(trace)
    pol = get_policy(policy)
    cost = get_profile(profile)
    if sla_tps is not None and not (np.isfinite(sla_tps) and sla_tps > 0):
        raise SpecsimError(f"--sla-tps must be a positive number, got {sla_tps}")
    slo_ms = parse_slo(slo)
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
    limits = EngineLimits(
        max_running=int(max_running if max_running is not None else cost.max_running),
        kv_tokens=int(kv_tokens if kv_tokens is not None else cost.kv_tokens),
        prefill_budget=int(prefill_budget if prefill_budget is not None else cost.prefill_budget),
    )
    if limits.prefill_budget < 1:
        raise SpecsimError(f"prefill_budget must be a positive integer, got {prefill_budget}")
    if limits.kv_tokens < 1:
        raise SpecsimError(f"--kv-tokens must be a positive integer, got {limits.kv_tokens}")
    if progress is not None and not getattr(progress, "total", 1):
        known = wl.arrival_s.shape[0] if wl.open_loop else wl.max_jobs
        if known:  # a bar made before the load was known learns its total here
            progress.total = float(known)
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
    )
    raw = engine.run()
    wall = time.perf_counter() - t0
    closed_c = int(wl.concurrency) if wl.kind == "closed" else None
    summary = summarize(raw, sla_tps, wall, slo_ms, closed_c, cost.gpus)
    if raw.max_batch_tokens > cost.b_max:
        warnings.warn(
            f"profile {cost.name!r} covers token batches up to {cost.b_max}; this run reached "
            f"{raw.max_batch_tokens}, extrapolated linearly from the last two points",
            stacklevel=2,
        )
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
        "profile_b_max": cost.b_max,
        "seed": int(seed),
        "sla_tps": sla_tps,
        "slo_ms": slo_ms,
        "calibrate": calibrate,
        "max_running": limits.max_running,
        "kv_tokens": limits.kv_tokens,
        "prefill_budget": limits.prefill_budget,
        **cal,
    }
    cat = tr.category if tr.category is not None else None
    return ReplayResult(
        summary=summary,
        requests=request_frame(raw, np.asarray(tr.request_ids), cat),
        steps=step_frame(raw),
        config=config,
        tokens=token_frame(raw),
    )
