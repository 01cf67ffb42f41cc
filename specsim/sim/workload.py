"""Workloads: when requests arrive and which trace request each one replays.

Four kinds:

- ``poisson``: open loop, exponential gaps at ``rate`` req/s.
- ``gamma``: open loop, Gamma gaps with mean 1/rate and coefficient of variation ``cv`` (cv > 1:
  bursts; cv = 1 is Poisson).
- ``closed``: closed loop at ``concurrency`` C: C requests start at t = 0 and a new one arrives
  the moment one finishes (the DSpark paper's "concurrent requests").
- ``replay``: arrival times and lengths from a CSV in the Azure format (``arrived_at``,
  ``num_prefill_tokens``, ``num_decode_tokens``), shifted so that the first arrives at 0.

Mapping to trace requests. Synthetic arrivals (poisson, gamma, closed) take the trace's requests
in a seeded permutation (stream ``"requests"``), cycled: job i replays ``perm[i % N]`` with the
trace's own prompt and output lengths. CSV arrivals use length-matched sampling (stream
``"match"``): job i replays a uniformly random trace request among those whose output_len >=
num_decode_tokens, its output capped at num_decode_tokens; if none is that long, a random one
among the longest. Its prompt_len is the CSV's num_prefill_tokens.

Bounds: ``requests`` N stops after N jobs; ``duration`` S admits no arrival after S seconds (jobs
already in the system run to completion). Without either: every trace request once (synthetic)
or every CSV row (replay).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

from specsim.errors import SpecsimError
from specsim.limits import MAX_REQUESTS_ENV, max_requests
from specsim.rng import stream
from specsim.sim.config import MAX_CV, MIN_CV
from specsim.trace.model import Trace

BUILTIN_ARRIVALS = {
    "azure-conv": "azure-llm-inference-2023-conv.csv",
    "azure-code": "azure-llm-inference-2023-code.csv",
}


@dataclass(frozen=True, eq=False)
class Workload:
    """Jobs to run. Open loop: ``arrival_s`` (n,) sorted, all known up front.

    Closed loop: ``arrival_s`` is None; the engine asks :meth:`job` for the next one when a
    request finishes, until ``max_jobs`` (None: unbounded, stop by ``duration``).
    """

    kind: str
    describe: str
    arrival_s: np.ndarray | None
    trace_idx: np.ndarray  # open: per job; closed: the cycle order (a permutation)
    prompt_len: np.ndarray  # open: per job; closed: per trace request
    output_len: np.ndarray  # open: per job (capped); closed: per trace request
    concurrency: int = 0
    max_jobs: int | None = None
    duration: float | None = None
    rate: float | None = None

    @property
    def open_loop(self) -> bool:
        return self.arrival_s is not None

    def job(self, i: int) -> tuple[int, int, int]:
        """(trace request, prompt_len, output_len) of closed-loop job i."""
        t = int(self.trace_idx[i % self.trace_idx.shape[0]])
        return t, int(self.prompt_len[t]), int(self.output_len[t])

    def n_jobs_hint(self) -> int:
        if self.open_loop:
            return int(self.arrival_s.shape[0])
        return int(self.max_jobs) if self.max_jobs is not None else 4 * max(self.concurrency, 1)


# Tokens one request may hold (prompt or output): beyond any real model's context by far, and far
# inside int64 so that sums of them cannot wrap.
MAX_TOKENS_PER_REQUEST = 10_000_000


def check_request_count(n: float, what: str) -> None:
    """Refuse, before anything is allocated, a replay of more requests than the limit."""
    limit = max_requests()
    if not n <= limit:
        raise SpecsimError(
            f"{what} means about {n:,.0f} requests, more than the limit of {limit:,} (memory "
            f"~{100 * n / 2**30:,.1f} GiB); use fewer, or raise the limit with "
            f"{MAX_REQUESTS_ENV}=N"
        )


def _check_bounds(trace: Trace, requests: int | None, duration: float | None) -> None:
    """The checks every workload makes first: a non-empty trace and at most one bound."""
    if trace.n_requests == 0:
        raise SpecsimError("the trace has no requests; record or synthesise one first")
    if requests is not None and duration is not None:
        raise SpecsimError("give --requests or --duration, not both")
    if requests is not None and (int(requests) < 1 or int(requests) != requests):
        raise SpecsimError(f"--requests must be a positive integer, got {requests}")
    if requests is not None:
        check_request_count(int(requests), f"--requests {requests}")
    if duration is not None and not (np.isfinite(duration) and duration > 0):
        raise SpecsimError(f"--duration must be a positive number of seconds, got {duration}")


def _gaps(rng: np.random.Generator, rate: float, cv: float | None, n: int) -> np.ndarray:
    if cv is None or cv == 1.0:
        return rng.exponential(1.0 / rate, size=n)
    shape = 1.0 / (cv * cv)
    return rng.gamma(shape, 1.0 / (rate * shape), size=n)


def open_loop_times(
    rate: float, cv: float | None, seed: int, n: int | None, duration: float | None
) -> np.ndarray:
    """Arrival times (sorted) of a renewal process: n of them, or all up to ``duration``."""
    rng = stream(seed, "arrivals")
    if n is not None:
        return np.cumsum(_gaps(rng, rate, cv, n))
    chunks, t0 = [], 0.0
    chunk = max(64, int(rate * duration * 1.2) + 64)
    while True:
        times = t0 + np.cumsum(_gaps(rng, rate, cv, chunk))
        chunks.append(times)
        if times[-1] > duration:
            break
        t0 = float(times[-1])
    times = np.concatenate(chunks)
    return times[times <= duration]


class TraceLengths:
    """The minimal trace view :func:`synthetic` reads (prompt and output lengths): what a real
    engine serving prompts without a recorded trace gives the workload generator."""

    def __init__(self, prompt_len, output_len) -> None:  # type: ignore[no-untyped-def]
        self.prompt_len = np.asarray(prompt_len, dtype=np.int64)
        self.output_len = np.asarray(output_len, dtype=np.int64)
        self.n_requests = int(self.prompt_len.shape[0])


def synthetic(
    trace: Trace,
    *,
    rate: float | None = None,
    cv: float | None = None,
    concurrency: int | None = None,
    requests: int | None = None,
    duration: float | None = None,
    seed: int = 0,
) -> Workload:
    """Poisson / Gamma open loop at ``rate`` or closed loop at ``concurrency``."""
    _check_bounds(trace, requests, duration)
    perm = stream(seed, "requests").permutation(trace.n_requests).astype(np.int64)
    prompt = trace.prompt_len.astype(np.int64)
    out = trace.output_len.astype(np.int64)
    if concurrency is not None:
        if cv is not None:
            raise SpecsimError("--cv shapes open-loop arrivals; use it with --rate")
        if int(concurrency) < 1 or int(concurrency) != concurrency:
            raise SpecsimError(f"--concurrency must be a positive integer, got {concurrency}")
        max_jobs = requests if requests is not None else (None if duration else trace.n_requests)
        return Workload(
            kind="closed",
            describe=f"closed loop, {int(concurrency)} concurrent",
            arrival_s=None,
            trace_idx=perm,
            prompt_len=prompt,
            output_len=out,
            concurrency=int(concurrency),
            max_jobs=max_jobs,
            duration=duration,
        )
    if rate is None or not (np.isfinite(rate) and rate > 0):
        raise SpecsimError(f"--rate must be a positive number of requests/s, got {rate}")
    if cv is not None and not (np.isfinite(cv) and MIN_CV <= cv <= MAX_CV):
        raise SpecsimError(
            f"--cv must be a coefficient of variation in [{MIN_CV:g}, {MAX_CV:g}] (1 is "
            f"Poisson), got {cv}"
        )
    n = requests if requests is not None else (None if duration else trace.n_requests)
    if n is None:
        check_request_count(float(rate) * float(duration), f"--rate {rate:g} for {duration:g} s")
    times = open_loop_times(float(rate), cv, seed, n, duration)
    idx = perm[np.arange(times.shape[0]) % trace.n_requests]
    kind = "poisson" if cv is None or cv == 1.0 else "gamma"
    desc = f"{kind} {rate:g} req/s" + (f", cv {cv:g}" if kind == "gamma" else "")
    return Workload(
        kind=kind,
        describe=desc,
        arrival_s=times,
        trace_idx=idx,
        prompt_len=prompt[idx],
        output_len=out[idx],
        duration=duration,
        rate=float(rate),
    )


def resolve_arrivals_path(spec: str | os.PathLike) -> tuple[str, Callable[[], str]]:
    """(display name, text reader) of a built-in arrivals name or a CSV path."""
    s = str(spec)
    if s in BUILTIN_ARRIVALS or s + ".csv" in BUILTIN_ARRIVALS.values():
        fname = BUILTIN_ARRIVALS.get(s, s + ".csv")
        res = resources.files("specsim") / "data" / "workloads" / fname
        return s, res.read_text
    p = Path(s)
    if not p.is_file():
        raise SpecsimError(
            f"arrivals file {s!r} does not exist; give a CSV path or one of "
            f"{', '.join(BUILTIN_ARRIVALS)}"
        )
    return p.name, p.read_text


def read_arrivals(spec: str | os.PathLike) -> tuple[str, np.ndarray, np.ndarray, np.ndarray]:
    """(name, arrival seconds from 0, prompt tokens, decode tokens) of an Azure-format CSV."""
    import io

    import pandas as pd

    name, read = resolve_arrivals_path(spec)
    try:
        df = pd.read_csv(io.StringIO(read()))
    except Exception as exc:  # noqa: BLE001
        raise SpecsimError(f"arrivals {name!r} is not a readable CSV: {exc}") from None
    need = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise SpecsimError(f"arrivals {name!r} lacks column(s) {', '.join(missing)}")
    if len(df) == 0:
        raise SpecsimError(f"arrivals {name!r} has no rows")
    t = pd.to_numeric(df["arrived_at"], errors="coerce").to_numpy(np.float64)
    p = pd.to_numeric(df["num_prefill_tokens"], errors="coerce").to_numpy(np.float64)
    d = pd.to_numeric(df["num_decode_tokens"], errors="coerce").to_numpy(np.float64)
    if not (np.all(np.isfinite(t)) and np.all(np.isfinite(p)) and np.all(np.isfinite(d))):
        raise SpecsimError(f"arrivals {name!r} has empty or non-numeric cells")
    if np.any(t < 0):
        bad = int(np.flatnonzero(t < 0)[0])
        raise SpecsimError(
            f"arrivals {name!r} row {bad + 2}: arrived_at = {t[bad]:g} is negative; arrival "
            "times are seconds from the start of the log, 0 or more"
        )
    if np.any(p < 0) or np.any(d < 1):
        raise SpecsimError(f"arrivals {name!r}: prefill tokens must be >= 0 and decode >= 1")
    for col, v in (("num_prefill_tokens", p), ("num_decode_tokens", d)):
        if np.any(v > MAX_TOKENS_PER_REQUEST) or np.any(v != np.floor(v)):
            bad = int(np.flatnonzero((v > MAX_TOKENS_PER_REQUEST) | (v != np.floor(v)))[0])
            raise SpecsimError(
                f"arrivals {name!r} row {bad + 2}: {col} = {v[bad]:g} is not a whole number of "
                f"at most {MAX_TOKENS_PER_REQUEST:,} tokens; fix the CSV"
            )
    check_request_count(t.shape[0], f"arrivals {name!r}")
    order = np.argsort(t, kind="stable")
    t = t[order]
    return name, t - t[0], p[order].astype(np.int64), d[order].astype(np.int64)


def length_matched(trace_out: np.ndarray, want: np.ndarray, seed: int) -> np.ndarray:
    """For each wanted output length, a random trace request at least that long (else one of the
    longest). Vectorised over jobs."""
    order = np.argsort(trace_out, kind="stable")
    sorted_out = trace_out[order]
    n = sorted_out.shape[0]
    lo = np.searchsorted(sorted_out, want, side="left")
    first_longest = int(np.searchsorted(sorted_out, sorted_out[-1], side="left"))
    lo = np.where(lo < n, lo, first_longest)
    u = stream(seed, "match").random(want.shape[0])
    pick = lo + np.minimum((u * (n - lo)).astype(np.int64), n - lo - 1)
    return order[pick]


def replay_arrivals(
    trace: Trace,
    arrivals: str | os.PathLike,
    *,
    requests: int | None = None,
    duration: float | None = None,
    seed: int = 0,
) -> Workload:
    """Open loop from an Azure-format CSV, mapped to trace requests by length-matched sampling."""
    _check_bounds(trace, requests, duration)
    name, t, prompt, dec = read_arrivals(arrivals)
    keep = slice(None)
    if requests is not None:
        keep = slice(0, int(requests))
    elif duration is not None:
        keep = slice(0, int(np.searchsorted(t, duration, side="right")))
    t, prompt, dec = t[keep], prompt[keep], dec[keep]
    trace_out = trace.output_len.astype(np.int64)
    idx = length_matched(trace_out, dec, seed)
    out = np.minimum(trace_out[idx], dec)
    rate = (t.shape[0] - 1) / t[-1] if t.shape[0] > 1 and t[-1] > 0 else None
    return Workload(
        kind="replay",
        describe=f"arrivals {name} ({t.shape[0]} requests)",
        arrival_s=t,
        trace_idx=idx,
        prompt_len=prompt,
        output_len=out,
        duration=duration,
        rate=rate,
    )


def make_workload(
    trace: Trace,
    *,
    rate: float | None = None,
    concurrency: int | None = None,
    arrivals: str | os.PathLike | None = None,
    cv: float | None = None,
    requests: int | None = None,
    duration: float | None = None,
    seed: int = 0,
) -> Workload:
    """Exactly one of rate / concurrency / arrivals; none given means concurrency 1."""
    given = [x is not None for x in (rate, concurrency, arrivals)]
    if sum(given) > 1:
        raise SpecsimError("give exactly one load: --rate, --concurrency or --arrivals")
    if arrivals is not None:
        if cv is not None:
            raise SpecsimError("--cv shapes open-loop arrivals; use it with --rate")
        return replay_arrivals(trace, arrivals, requests=requests, duration=duration, seed=seed)
    if rate is None and concurrency is None:
        concurrency = 1
    return synthetic(
        trace,
        rate=rate,
        cv=cv,
        concurrency=concurrency,
        requests=requests,
        duration=duration,
        seed=seed,
    )


class UnsteadyWarning(UserWarning):
    """A closed loop run too short to hold its concurrency for a measured window."""


def closed_loop_requests_needed(concurrency: int) -> int:
    """Requests a closed loop at C needs for a steady window: C to warm up, C measured, C to
    drain (the window must hold C completions for its throughput to mean something)."""
    return 3 * int(concurrency)


def check_steady_window(c: int, jobs: int, requests: int | None, require: bool) -> None:
    """The one rule for closed loops (``replay`` and ``sweep`` both call it): a closed loop at
    C must hold C in flight for a measured window (C to warm up, C measured, C to drain), or
    not run at all (``require``), or run with an :class:`UnsteadyWarning`."""
    need = closed_loop_requests_needed(c)
    if c < 1 or jobs >= need:
        return
    where = f"--requests {jobs}" if requests is not None else f"the trace's {jobs} requests"
    if require:
        raise SpecsimError(
            f"a closed loop at {c} concurrent needs at least {need} requests to hold {c} in "
            f"flight for a measured window (warm-up, window and drain of {c} each); "
            f"{where} are too few: pass --requests {need} (trace requests are reused in turn)"
        )
    warnings.warn(
        f"{where} are below the {need} a closed loop at {c} needs for a steady window: "
        "steady_throughput_tok_s and achieved_concurrency are NaN (throughput_tok_s includes "
        "warm-up and drain)",
        UnsteadyWarning,
        stacklevel=3,
    )
