"""Metrics of a replay, derived by pure functions from the engine's raw arrays.

Definitions (stated once, here):

- TTFT = first token time - arrival (the first token comes out of the prefill step).
- TPOT = (finish - first token) / (output tokens - 1); undefined (NaN) for one-token outputs.
- per-user tok/s = 1 / TPOT = (output tokens - 1) / (finish - first token): the decode speed a
  user sees, the quantity the DSpark paper's "tok/s/user" SLAs bound.
- tau = tokens emitted by decode steps / request decode steps (bonus token included; the
  prefill's first token is not a decode step and is excluded).
- verify_efficiency = accepted draft tokens / verified draft tokens (the DSpark paper's "share
  of verified draft tokens that are accepted"); NaN when no draft was verified (``ar``).
- token_efficiency = decode tokens emitted / tokens verified (sum over request-steps of 1 + l):
  1.0 when nothing verified is wasted (e.g. ``ar``).
- mean_batch_tokens = mean over engine steps of the step's token batch B (drafts, bonus
  tokens and prefill tokens).
- throughput = all output tokens / simulated time (time 0 to the last step's end), of the
  whole deployment the profile describes; throughput_per_gpu = throughput / the profile's
  ``gpus`` (an 8-GPU node's profile says 8).
- sla_attainment = share of completed requests whose per-user tok/s >= sla_tps (one-token
  outputs, having no decode phase, count as meeting it).
- mean_in_system = time-average of (running + queued) requests over the step log (for
  Little's law), using the count at each step's start over the step's duration.
- ITL (inter-token latency, as vLLM's benchmark_serving measures it: the gap between two
  streamed chunks of one request) = the time from one decode step's end to the next for a
  request in both; each decode step gives each of its decoding requests one chunk (all the
  tokens the step accepted), so the ITL distribution is that of the step periods (scheduler wait
  + step), weighted by the step's decoding requests. With speculation a chunk holds tau tokens:
  ITL is per chunk, TPOT per token.
- e2e latency = finish - arrival.
- request_throughput = completed requests / simulated time.
- goodput (DistServe's sense) = completed requests per second that met every SLO given
  (``slo={"ttft": ms, "tpot": ms, "e2e": ms}``); slo_attainment = their share.
- Closed loop at C (steady state, as serving benchmarks measure it): the C first requests start
  together and the last ones drain alone, so neither end shows the load C. The steady window
  runs from the C-th completion (every slot has turned over once) to the last admission (after
  it fewer than C are in flight); steady_throughput_tok_s = tokens emitted by steps that start
  in the window / its length, achieved_concurrency = time-average of requests in the system
  over it (whole run for open loops). No window (too few requests): NaN, and ``replay()`` refuses
  such a run up front with the requests it needs (``sim.workload.check_steady_window``).
Percentiles (p50/p90/p95/p99) are numpy's linear interpolation, as benchmark_serving computes
them; means and percentiles skip undefined values (NaN TPOT of one-token outputs).
"""

from __future__ import annotations

import numpy as np

from specsim.sim.steplog import STEP_COLUMNS, RawLog

COL = {name: i for i, name in enumerate(STEP_COLUMNS)}


def _per_step(raw: RawLog) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(period s = duration + sched_wait, requests in the system, decoding requests) per step,
    float64, from the full step log or from the reduced one (``RawLog.step_sums``): the same
    values either way, so every sum over them is the same to the bit."""
    if raw.step_log is not None:
        log, c = raw.step_log, COL
        period = log[:, c["duration_s"]] + log[:, c["sched_wait_s"]]
        return period, log[:, c["running"]] + log[:, c["queued"]], log[:, c["decoding"]]
    s = _sums(raw)
    return s.period_s, s.in_system.astype(np.float64), s.decoding.astype(np.float64)


def _sums(raw: RawLog):  # noqa: ANN202 - StepSums
    if raw.step_sums is None:
        raise ValueError("this RawLog has neither a step log nor step sums")
    return raw.step_sums


def ttft_s(raw: RawLog) -> np.ndarray:
    return raw.first_token_s - raw.arrival_s


def tpot_s(raw: RawLog) -> np.ndarray:
    extra = (raw.output_len - 1).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(extra > 0, (raw.finish_s - raw.first_token_s) / extra, np.nan)


def per_user_tps(raw: RawLog) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return 1.0 / tpot_s(raw)


def _pct(x: np.ndarray, q: float) -> float:
    x = x[np.isfinite(x)]
    return float(np.percentile(x, q)) if x.size else float("nan")


def _mean(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else float("nan")


PERCENTILES = (50, 90, 95, 99)
SLO_KEYS = ("ttft", "tpot", "e2e")


def _weighted_pct(x: np.ndarray, w: np.ndarray, q: float) -> float:
    """Percentile of x where each value counts w times (w: whole numbers of chunks)."""
    keep = np.isfinite(x) & (w > 0)
    x, w = x[keep], w[keep]
    if x.size == 0:
        return float("nan")
    order = np.argsort(x, kind="stable")
    x, cw = x[order], np.cumsum(w[order])
    # linear interpolation between order statistics, as np.percentile of the expanded sample
    pos = q / 100.0 * (cw[-1] - 1)
    lo = int(np.searchsorted(cw, np.floor(pos) + 1))
    hi = int(np.searchsorted(cw, np.ceil(pos) + 1))
    frac = pos - np.floor(pos)
    return float(x[lo] + (x[hi] - x[lo]) * frac)


def itl_ms(log: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(chunk gap in ms, chunks) per engine step: the inter-token latency distribution."""
    c = COL
    period = (log[:, c["duration_s"]] + log[:, c["sched_wait_s"]]) * 1000.0
    return period, log[:, c["decoding"]]


def latency_summary(
    raw: RawLog, done: np.ndarray, slo: dict[str, float] | None
) -> dict[str, float]:
    """Percentiles of TTFT, TPOT, ITL and e2e latency, request throughput, goodput."""
    ttft = ttft_s(raw)[done] * 1000.0
    tpot = tpot_s(raw)[done] * 1000.0
    e2e = (raw.finish_s - raw.arrival_s)[done] * 1000.0
    period, _, chunks = _per_step(raw)
    gap = period * 1000.0  # itl_ms, from either form of the log
    out: dict[str, float] = {}
    for name, x in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)):
        out[f"{name}_ms_mean"] = _mean(x)
        for q in PERCENTILES:
            out[f"{name}_ms_p{q}"] = _pct(x, q)
    total = float(chunks.sum())
    out["itl_ms_mean"] = float((gap * chunks).sum() / total) if total else float("nan")
    for q in PERCENTILES:
        out[f"itl_ms_p{q}"] = _weighted_pct(gap, chunks, q)
    # the tail a p99 hides: one long prefill among thousands of decode steps, a preemption
    out["itl_ms_p99.9"] = _weighted_pct(gap, chunks, 99.9)
    stepped = gap[chunks > 0]
    worst = float(stepped.max()) if stepped.size else float("nan")
    if raw.stall_s is not None and raw.stall_s.size and np.nanmax(raw.stall_s) > 0:
        worst = max(worst, float(np.nanmax(raw.stall_s)) * 1000.0)  # across a preemption
    out["itl_ms_max"] = worst
    sim_t = raw.sim_time_s
    n_done = int(done.sum())
    out["request_throughput"] = n_done / sim_t if sim_t > 0 else float("nan")
    if slo:
        ok = np.ones(n_done, dtype=bool)
        for key, x in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)):
            if key in slo:
                ok &= np.where(np.isnan(x), True, x <= slo[key])  # no decode: meets TPOT
        out["goodput_req_s"] = float(ok.sum()) / sim_t if sim_t > 0 else float("nan")
        out["slo_attainment"] = float(ok.mean()) if n_done else float("nan")
    else:
        out["goodput_req_s"] = float("nan")
        out["slo_attainment"] = float("nan")
    return out


def steady_state(raw: RawLog, concurrency: int | None) -> dict[str, float]:
    """Steady-state window of a closed loop (see the module docstring); whole run otherwise."""
    c = COL
    log = raw.step_log
    period, in_sys, _ = _per_step(raw)
    nan = float("nan")
    if concurrency is None:
        total = float(period.sum())
        return {
            "achieved_concurrency": float((in_sys * period).sum() / total) if total else nan,
            "steady_window_s": nan,
            "steady_throughput_tok_s": nan,
        }
    finish = np.sort(raw.finish_s[np.isfinite(raw.finish_s)])
    admitted = raw.admitted_s[np.isfinite(raw.admitted_s)]
    if finish.shape[0] < concurrency or admitted.size == 0:
        t0, t1 = nan, nan
    else:
        t0, t1 = float(finish[concurrency - 1]), float(admitted.max())
    if not t1 > t0:
        return {"achieved_concurrency": nan, "steady_window_s": nan,
                "steady_throughput_tok_s": nan}  # fmt: skip
    if log is not None:
        start = log[:, c["time_s"]]
        inside = (start >= t0) & (start < t1)
        emitted = float(log[inside, c["emitted_tokens"]].sum())
    else:  # steps start in time order: the window is the steps [k0, k1), found during the run
        (k0, e0), (k1, e1) = _sums(raw).window_start, _sums(raw).window_end
        inside = slice(k0, max(k0, k1))
        emitted = float(max(e1 - e0, 0))
    window = float(period[inside].sum())
    return {
        "achieved_concurrency": float((in_sys * period)[inside].sum() / window) if window else nan,
        "steady_window_s": t1 - t0,
        "steady_throughput_tok_s": emitted / (t1 - t0),
    }


def parse_slo(text: str | dict[str, float] | None) -> dict[str, float] | None:
    """``"ttft=200,tpot=50"`` (milliseconds) -> {"ttft": 200.0, "tpot": 50.0}."""
    from specsim.errors import SpecsimError

    if text is None or isinstance(text, dict):
        slo = text
    else:
        slo = {}
        for part in str(text).split(","):
            key, sep, value = part.strip().partition("=")
            try:
                slo[key.strip().lower()] = float(value) if sep else float("nan")
            except ValueError:
                slo[key.strip().lower()] = float("nan")
    if slo is None:
        return None
    for key, value in slo.items():
        if key not in SLO_KEYS or not (np.isfinite(value) and value > 0):
            raise SpecsimError(
                f"--slo {text!r}: give ttft=MS, tpot=MS and/or e2e=MS with positive "
                "milliseconds, e.g. --slo ttft=200,tpot=50"
            )
    return dict(slo) or None


def step_totals(log: np.ndarray) -> dict[str, float]:
    """Sums over the step log that the summary needs."""
    c = COL
    prefilling = log[:, c["prefilling"]]
    decoding = log[:, c["decoding"]]
    emitted = log[:, c["emitted_tokens"]]
    verified = log[:, c["verified_drafts"]]
    dec_emitted = emitted.sum() - prefilling.sum()
    dec_steps = decoding.sum()
    dur = log[:, c["duration_s"]] + log[:, c["sched_wait_s"]]
    in_sys = log[:, c["running"]] + log[:, c["queued"]]
    return {
        "decode_emitted": float(dec_emitted),
        "decode_request_steps": float(dec_steps),
        "verified": float(verified.sum()),
        "accepted": float(log[:, c["accepted_drafts"]].sum()),
        "engine_steps": float(log.shape[0]),
        "batch_tokens": float(log[:, c["batch_tokens"]].sum()),
        "in_system_area": float((in_sys * dur).sum()),
    }


def _lean_totals(raw: RawLog) -> dict[str, float]:
    """``step_totals`` from the reduced log: integer sums kept as the run went (exact in any
    order), the time in system summed over the same per-step values as the full log's."""
    s = _sums(raw)
    period, in_sys, decoding = _per_step(raw)
    return {
        "decode_emitted": float(s.emitted - s.prefilling),
        "decode_request_steps": float(decoding.sum()),
        "verified": float(s.verified),
        "accepted": float(s.accepted),
        "engine_steps": float(s.n_steps),
        "batch_tokens": float(s.batch_tokens),
        "in_system_area": float((in_sys * period).sum()),
    }


def summarize(
    raw: RawLog,
    sla_tps: float | None,
    wall_time_s: float,
    slo: dict[str, float] | None = None,
    concurrency: int | None = None,
    gpus: int = 1,
) -> dict[str, float]:
    """The summary dict of a replay (keys listed in docs/simulator.md); ``concurrency``: the
    closed loop's C (None for open loops), for the steady-state window."""
    done = np.isfinite(raw.finish_s)
    t = step_totals(raw.step_log) if raw.step_log is not None else _lean_totals(raw)
    total_out = float(raw.emitted.sum())
    sim_t = raw.sim_time_s
    ttft = ttft_s(raw)[done] * 1000.0
    tpot = tpot_s(raw)[done] * 1000.0
    tps = per_user_tps(raw)[done]
    steps = t["engine_steps"]
    dec = t["decode_request_steps"]
    out = {
        "requests_completed": int(done.sum()),
        "output_tokens": int(total_out),
        "sim_time_s": sim_t,
        "wall_time_s": float(wall_time_s),
        "throughput_tok_s": total_out / sim_t if sim_t > 0 else float("nan"),
        "per_user_tps_mean": _mean(tps),
        "per_user_tps_p50": _pct(tps, 50),
        "ttft_ms_p50": _pct(ttft, 50),
        "ttft_ms_p99": _pct(ttft, 99),
        "ttft_ms_mean": _mean(ttft),
        "tpot_ms_p50": _pct(tpot, 50),
        "tpot_ms_p99": _pct(tpot, 99),
        "tpot_ms_mean": _mean(tpot),
        "tau": t["decode_emitted"] / dec if dec else float("nan"),
        "verified_draft_tokens": int(t["verified"]),
        "accepted_draft_tokens": int(t["accepted"]),
        "verify_efficiency": t["accepted"] / t["verified"] if t["verified"] else float("nan"),
        "token_efficiency": (t["decode_emitted"] / (dec + t["verified"]) if dec else float("nan")),
        "mean_batch_tokens": t["batch_tokens"] / steps if steps else 0.0,
        "engine_steps": int(steps),
        "mean_in_system": t["in_system_area"] / sim_t if sim_t > 0 else float("nan"),
        "max_batch_tokens": int(raw.max_batch_tokens),
        "sla_tps": float(sla_tps) if sla_tps is not None else float("nan"),
        "sla_attainment": sla_attainment(tps, sla_tps),
        "sim_tokens_per_wall_s": total_out / wall_time_s if wall_time_s > 0 else float("nan"),
    }
    for key, value in latency_summary(raw, done, slo).items():
        out.setdefault(key, value)
    out.update(steady_state(raw, concurrency))
    out["preemptions"] = int(raw.preemptions)
    out["recomputed_tokens"] = int(raw.recomputed_tokens)
    out["gpus"] = int(gpus)
    out["throughput_per_gpu_tok_s"] = out["throughput_tok_s"] / gpus
    # what `vllm bench serve` prints beside output throughput: prompts of the requests that
    # finished (a request's prompt counts once even if it was recomputed after a preemption)
    total_in = float(raw.prompt_len[done].sum())
    out["input_tokens"] = int(total_in)
    out["input_throughput_tok_s"] = total_in / sim_t if sim_t > 0 else float("nan")
    out["total_throughput_tok_s"] = out["input_throughput_tok_s"] + out["throughput_tok_s"]
    return out


def sla_attainment(tps: np.ndarray, sla_tps: float | None) -> float:
    """Share of requests at or above ``sla_tps`` per-user tok/s (NaN rates: no decode, meet it)."""
    if sla_tps is None or tps.size == 0:
        return float("nan")
    ok = np.where(np.isnan(tps), True, tps >= sla_tps)
    return float(ok.mean())


def request_frame(raw: RawLog, trace_ids: np.ndarray, category: np.ndarray | None):
    """One row per request (tidy)."""
    import pandas as pd

    jt = raw.job_trace
    return pd.DataFrame(
        {
            "id": np.arange(jt.shape[0], dtype=np.int64),
            "trace_request": trace_ids[jt],
            "trace_index": jt,
            "category": (category[jt] if category is not None else np.full(jt.shape, "")),
            "arrival_s": raw.arrival_s,
            "admitted_s": raw.admitted_s,
            "first_token_s": raw.first_token_s,
            "finish_s": raw.finish_s,
            "prompt_len": raw.prompt_len,
            "output_tokens": raw.emitted,
            "decode_steps": raw.steps,
            "verified_drafts": raw.verified,
            "accepted_drafts": raw.accepted,
            "ttft_ms": ttft_s(raw) * 1000.0,
            "tpot_ms": tpot_s(raw) * 1000.0,
            "per_user_tps": per_user_tps(raw),
        }
    )


def step_frame(raw: RawLog):
    """One row per engine step (tidy); None when the steps were not recorded."""
    import pandas as pd

    log = raw.step_log
    if log is None:
        return None
    data = {}
    for name, i in COL.items():
        col = log[:, i]
        data[name] = col if name.endswith("_s") else col.astype(np.int64)
    return pd.DataFrame(data)


def token_frame(raw: RawLog):
    """One row per (request, step) emission: when each request received how many tokens."""
    import pandas as pd

    if raw.token_job is None:
        return None
    return pd.DataFrame({"id": raw.token_job, "time_s": raw.token_time, "tokens": raw.token_count})
