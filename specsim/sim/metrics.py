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
them; means and percentiles skip undefined values (NaN TPOT of one-token outputs). Means of
per-request values are their exactly rounded sum (``math.fsum``) over their count: the same to
the bit in any order and however the requests are split into batches, so the streaming summary
(:mod:`specsim.sim.streaming`, which never holds every request) gives the same means, counts,
SLA shares and goodput as this one; its percentiles come from a sketch beyond a size.
"""

from __future__ import annotations

import math

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
    return tpot_of(raw.first_token_s, raw.finish_s, raw.output_len)


def tpot_of(first_s: np.ndarray, finish_s: np.ndarray, output_len: np.ndarray) -> np.ndarray:
    """TPOT in seconds from the arrays (one definition for the whole-run and streamed forms)."""
    extra = (output_len - 1).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(extra > 0, (finish_s - first_s) / extra, np.nan)


def per_user_tps(raw: RawLog) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return 1.0 / tpot_s(raw)


def _pct(x: np.ndarray, q: float) -> float:
    x = x[np.isfinite(x)]
    return float(np.percentile(x, q)) if x.size else float("nan")


def _mean(x: np.ndarray) -> float:
    """Mean of the finite values: their exactly rounded sum over their count (see the module
    docstring: independent of order and batching, unlike numpy's pairwise sum)."""
    x = x[np.isfinite(x)]
    return math.fsum(x.tolist()) / x.size if x.size else float("nan")


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


class ExactRequests:
    """The request-level statistics of a run, from its whole per-job arrays.

    What :func:`summarize` reads of the requests, behind one small interface that the
    streaming accumulator (:class:`specsim.sim.streaming.StreamingSummary`) also offers:
    ``n_done``, ``output_tokens``, ``input_tokens``, ``mean(name)`` / ``pct(name, q)`` of
    ``ttft`` / ``tpot`` / ``e2e`` (ms) and ``tps`` (per-user tok/s) over completed requests,
    ``sla_attainment``, ``slo_ok`` (requests meeting every SLO; None without SLOs),
    ``kth_finish(c)``, ``max_admitted`` and ``max_stall`` (s)."""

    def __init__(self, raw: RawLog, sla_tps: float | None, slo: dict[str, float] | None) -> None:
        done = np.isfinite(raw.finish_s)
        self.n_done = int(done.sum())
        self.values = {
            "ttft": ttft_s(raw)[done] * 1000.0,
            "tpot": tpot_s(raw)[done] * 1000.0,
            "e2e": (raw.finish_s - raw.arrival_s)[done] * 1000.0,
            "tps": per_user_tps(raw)[done],
        }
        self.output_tokens = int(raw.emitted.sum())
        self.input_tokens = int(raw.prompt_len[done].sum())
        self.sla_attainment = sla_attainment(self.values["tps"], sla_tps)
        self.slo_ok = None
        if slo:
            ok = np.ones(self.n_done, dtype=bool)
            for key in SLO_KEYS:
                if key in slo:
                    x = self.values[key]
                    ok &= np.where(np.isnan(x), True, x <= slo[key])  # no decode: meets TPOT
            self.slo_ok = int(ok.sum())
        self._finish = raw.finish_s[done]
        admitted = raw.admitted_s[np.isfinite(raw.admitted_s)]
        self.max_admitted = float(admitted.max()) if admitted.size else float("nan")
        st = raw.stall_s
        self.max_stall = float(np.nanmax(st)) if st is not None and st.size else float("nan")

    def mean(self, name: str) -> float:
        return _mean(self.values[name])

    def pct(self, name: str, q: float) -> float:
        return _pct(self.values[name], q)

    def kth_finish(self, c: int) -> float:
        """The c-th completion's time (NaN with fewer than c completions)."""
        f = self._finish
        if f.shape[0] < c:
            return float("nan")
        return float(np.partition(f, c - 1)[c - 1])


def latency_summary(
    raw: RawLog,
    done: np.ndarray | None,
    slo: dict[str, float] | None,
    req=None,  # noqa: ANN001
) -> dict[str, float]:
    """Percentiles of TTFT, TPOT, ITL and e2e latency, request throughput, goodput.

    ``req``: the requests' statistics (:class:`ExactRequests` of ``raw`` when None; ``done``
    is then the completed requests, ``np.isfinite(raw.finish_s)``, as it always was)."""
    if req is None:
        req = ExactRequests(raw, None, slo)
    period, _, chunks = _per_step(raw)
    gap = period * 1000.0  # itl_ms, from either form of the log
    out: dict[str, float] = {}
    for name in ("ttft", "tpot", "e2e"):
        out[f"{name}_ms_mean"] = req.mean(name)
        for q in PERCENTILES:
            out[f"{name}_ms_p{q}"] = req.pct(name, q)
    total = float(chunks.sum())
    out["itl_ms_mean"] = float((gap * chunks).sum() / total) if total else float("nan")
    for q in PERCENTILES:
        out[f"itl_ms_p{q}"] = _weighted_pct(gap, chunks, q)
    # the tail a p99 hides: one long prefill among thousands of decode steps, a preemption
    out["itl_ms_p99.9"] = _weighted_pct(gap, chunks, 99.9)
    stepped = gap[chunks > 0]
    worst = float(stepped.max()) if stepped.size else float("nan")
    if req.max_stall > 0:
        worst = max(worst, req.max_stall * 1000.0)  # across a preemption
    out["itl_ms_max"] = worst
    sim_t = raw.sim_time_s
    n_done = req.n_done
    out["request_throughput"] = n_done / sim_t if sim_t > 0 else float("nan")
    if slo:
        ok = req.slo_ok  # a count: ok.mean() of the booleans is the same count over n_done
        out["goodput_req_s"] = float(ok) / sim_t if sim_t > 0 else float("nan")
        out["slo_attainment"] = ok / n_done if n_done else float("nan")
    else:
        out["goodput_req_s"] = float("nan")
        out["slo_attainment"] = float("nan")
    return out


def steady_state(raw: RawLog, concurrency: int | None, req=None) -> dict[str, float]:  # noqa: ANN001
    """Steady-state window of a closed loop (see the module docstring); whole run otherwise.

    ``req``: the requests' statistics (the C-th completion, the last admission); from ``raw``
    when None."""
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
    if req is None:
        req = ExactRequests(raw, None, None)
    t0, t1 = req.kth_finish(concurrency), req.max_admitted  # NaN: no window (below)
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
            if key.strip().lower() in slo:  # one bound per key: which one was meant?
                raise SpecsimError(
                    f"--slo {text!r} gives {key.strip().lower()} twice; give each of ttft, tpot "
                    "and e2e at most once, e.g. --slo ttft=200,tpot=50"
                )
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
    requests=None,  # noqa: ANN001 - ExactRequests | StreamingSummary
) -> dict[str, float]:
    """The summary dict of a replay (keys listed in docs/simulator.md); ``concurrency``: the
    closed loop's C (None for open loops), for the steady-state window.

    ``requests``: the requests' statistics, made with the same ``sla_tps`` and ``slo``: a
    :class:`specsim.sim.streaming.StreamingSummary` accumulated during the run (then ``raw``
    needs only its step log or sums and run totals); :class:`ExactRequests` of ``raw`` if None.
    """
    req = requests if requests is not None else ExactRequests(raw, sla_tps, slo)
    t = step_totals(raw.step_log) if raw.step_log is not None else _lean_totals(raw)
    total_out = float(req.output_tokens)
    sim_t = raw.sim_time_s
    steps = t["engine_steps"]
    dec = t["decode_request_steps"]
    out = {
        "requests_completed": req.n_done,
        "output_tokens": int(total_out),
        "sim_time_s": sim_t,
        "wall_time_s": float(wall_time_s),
        "throughput_tok_s": total_out / sim_t if sim_t > 0 else float("nan"),
        "per_user_tps_mean": req.mean("tps"),
        "per_user_tps_p50": req.pct("tps", 50),
        "ttft_ms_p50": req.pct("ttft", 50),
        "ttft_ms_p99": req.pct("ttft", 99),
        "ttft_ms_mean": req.mean("ttft"),
        "tpot_ms_p50": req.pct("tpot", 50),
        "tpot_ms_p99": req.pct("tpot", 99),
        "tpot_ms_mean": req.mean("tpot"),
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
        "sla_attainment": req.sla_attainment,
        "sim_tokens_per_wall_s": total_out / wall_time_s if wall_time_s > 0 else float("nan"),
    }
    for key, value in latency_summary(raw, None, slo, req).items():
        out.setdefault(key, value)
    out.update(steady_state(raw, concurrency, req))
    out["preemptions"] = int(raw.preemptions)
    out["recomputed_tokens"] = int(raw.recomputed_tokens)
    out["gpus"] = int(gpus)
    out["throughput_per_gpu_tok_s"] = out["throughput_tok_s"] / gpus
    # what `vllm bench serve` prints beside output throughput: prompts of the requests that
    # finished (a request's prompt counts once even if it was recomputed after a preemption)
    total_in = float(req.input_tokens)
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
    from types import SimpleNamespace

    jt = raw.job_trace
    rows = SimpleNamespace(
        job=np.arange(jt.shape[0], dtype=np.int64),
        trace_index=jt,
        arrival_s=raw.arrival_s,
        admitted_s=raw.admitted_s,
        first_token_s=raw.first_token_s,
        finish_s=raw.finish_s,
        prompt_len=raw.prompt_len,
        output_len=raw.output_len,
        emitted=raw.emitted,
        steps=raw.steps,
        verified=raw.verified,
        accepted=raw.accepted,
    )
    return request_columns(rows, trace_ids, category)


def request_columns(rows, trace_ids: np.ndarray, category: np.ndarray | None):  # noqa: ANN001, ANN201
    """The per-request table of ``rows`` (anything with the arrays of
    :class:`specsim.sim.streaming.Finished`): one definition for the whole run's table and the
    row groups a streamed run writes."""
    import pandas as pd

    jt = rows.trace_index
    tpot = tpot_of(rows.first_token_s, rows.finish_s, rows.output_len)
    with np.errstate(invalid="ignore", divide="ignore"):
        tps = 1.0 / tpot
    return pd.DataFrame(
        {
            "id": rows.job,
            "trace_request": trace_ids[jt],
            "trace_index": jt,
            "category": (category[jt] if category is not None else np.full(jt.shape, "")),
            "arrival_s": rows.arrival_s,
            "admitted_s": rows.admitted_s,
            "first_token_s": rows.first_token_s,
            "finish_s": rows.finish_s,
            "prompt_len": rows.prompt_len,
            "output_tokens": rows.emitted,
            "decode_steps": rows.steps,
            "verified_drafts": rows.verified,
            "accepted_drafts": rows.accepted,
            "ttft_ms": (rows.first_token_s - rows.arrival_s) * 1000.0,
            "tpot_ms": tpot * 1000.0,
            "per_user_tps": tps,
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
