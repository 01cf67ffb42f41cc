"""``specsim bench``: load any OpenAI-compatible (or llama.cpp) server and measure it the way
``specsim replay`` measures the simulator.

The load is specsim's own workload generator (:func:`specsim.sim.workload.make_workload`):
a closed loop at C (a new request the moment one finishes) or open-loop Poisson / Gamma
arrivals at a rate, over a list of prompts, so a bench run and a replay of the same prompts
send the same jobs in the same order. Every request streams; the client stamps the send, each
streamed chunk and the end on one monotonic clock. Metrics use the simulator's definitions:
TTFT, TPOT, ITL (the gaps between streamed chunks, each counting its tokens), e2e, throughput,
the closed loop's steady-state throughput (from the C-th completion to the last request sent),
goodput under ``--slo``; and, where the server reports them (llama-server's per-request
``timings``), the speculative counters: tokens drafted and accepted.

APIs: ``llama`` (llama-server's native ``/completion``: token-id prompts, ``timings``),
``completions`` (``/v1/completions``: vLLM, SGLang, llama-server) and ``chat``
(``/v1/chat/completions``, the server applies its chat template). The HTTP client is httpx.
"""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import numpy as np

from specsim.errors import SpecsimError
from specsim.serve.bench_config import BenchConfig, Job, Result
from specsim.serve.sse import StreamError, sse_json
from specsim.serve.stoppable import await_stoppable
from specsim.serve.wire import as_count, as_token_id

PERCENTILES = (50, 90, 95, 99)


def _payload(cfg: BenchConfig, job: Job) -> tuple[str, dict[str, Any]]:
    common = {"temperature": cfg.temperature, "stream": True, "seed": cfg.seed}
    if cfg.api == "llama":
        body = {"prompt": job.prompt, "n_predict": job.max_tokens, "cache_prompt": False}
        body.update(common, ignore_eos=cfg.ignore_eos)
        return "/completion", body
    body = {"model": cfg.model or "default", "max_tokens": job.max_tokens, **common}
    body["stream_options"] = {"include_usage": True}
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    if cfg.api == "chat":
        if not isinstance(job.prompt, str):
            raise SpecsimError("--api chat takes text prompts; use --api llama for token ids")
        body["messages"] = [{"role": "user", "content": job.prompt}]
        return "/v1/chat/completions", body
    body["prompt"] = job.prompt
    return "/v1/completions", body


def _chunk_tokens(cfg: BenchConfig, data: dict[str, Any]) -> int:
    """Tokens a streamed chunk carries (0 for a chunk with no text: usage, the final stats)."""
    if cfg.api == "llama":
        toks = data.get("tokens")
        if isinstance(toks, list):
            return len(toks)
        return 1 if data.get("content") else 0
    choices = data.get("choices") or []
    if not choices:
        return 0
    c = choices[0]
    text = c.get("text") if cfg.api == "completions" else (c.get("delta") or {}).get("content")
    return 1 if text else 0


class _Bounds:
    """Where a request stands against its time bounds (``--connect-timeout-s`` is httpx's): the
    next deadline on the loop's clock and, when it passes, which bound that was."""

    def __init__(self, cfg: BenchConfig, now: float) -> None:
        self.cfg = cfg
        self.start = now
        self.end = now + cfg.timeout_s  # the whole request
        self.first = True

    def next(self, now: float) -> float:
        """The deadline from ``now``: the first event's (counted from the send) until it came,
        then the next event's, never past the whole request's."""
        if self.first:
            return min(self.end, self.start + self.cfg.first_byte_timeout_s)
        return min(self.end, now + self.cfg.event_timeout_s)

    def event(self, now: float) -> float:
        """An event arrived at ``now``: the deadline for the next one."""
        self.first = False
        return self.next(now)

    def message(self, now: float) -> str:
        c = self.cfg
        if now >= self.end - 1e-3:
            return f"timeout: the request ran past {c.timeout_s:g} s (--timeout-s)"
        if self.first:
            return (
                f"timeout: no streamed event within {c.first_byte_timeout_s:g} s of sending "
                "(--first-byte-timeout-s)"
            )
        return f"timeout: no streamed event for {c.event_timeout_s:g} s (--event-timeout-s)"


async def _send(client, cfg: BenchConfig, i: int, job: Job, t0: float,  # noqa: ANN001
                sent: dict[int, Result]) -> Result:  # fmt: skip
    """One request, streamed, within its time bounds. Recorded in ``sent`` before it goes out,
    so a run stopped by a signal still has every request it sent."""
    import httpx

    path, body = _payload(cfg, job)
    res = Result(job=i, trace_id=job.trace_id, sent_s=time.perf_counter() - t0)
    sent[i] = res
    loop = asyncio.get_running_loop()
    bounds = _Bounds(cfg, loop.time())
    finished = False
    try:
        async with asyncio.timeout_at(bounds.next(loop.time())) as limit:
            async with client.stream("POST", cfg.url.rstrip("/") + path, json=body) as r:
                if r.status_code != 200:  # the body's start says why (never all of a huge one)
                    head = b""
                    async for piece in r.aiter_bytes():
                        head += piece
                        if len(head) >= 300:
                            break
                    res.error = f"HTTP {r.status_code}: {head[:300].decode(errors='replace')}"
                    return res
                async for data in sse_json(r):
                    limit.reschedule(bounds.event(loop.time()))
                    if (err := _server_error(data)) is not None:
                        raise StreamError(err)
                    now = time.perf_counter() - t0
                    # after the closing event only OpenAI's usage chunk belongs to the answer
                    n = 0 if finished else _chunk_tokens(cfg, data)
                    if cfg.api == "llama" and isinstance(data.get("tokens"), list):
                        res.tokens.extend(_token(t) for t in data["tokens"])
                    if n:
                        if not res.chunk_s:
                            res.first_s = now
                        res.chunk_s.append(now)
                        res.chunk_tokens.append(n)
                    _read_final(cfg, data, res, job.max_tokens)
                    finished = finished or _is_last(cfg, data)
                    if finished and cfg.api == "llama":  # "stop": true is llama-server's last
                        break
    except TimeoutError:
        res.error = bounds.message(loop.time())
        return res
    except StreamError as exc:  # already one line saying what the server sent
        res.error = str(exc)
        return res
    except httpx.ConnectTimeout:
        res.error = (
            f"timeout: no connection within {cfg.connect_timeout_s:g} s (--connect-timeout-s)"
        )
        return res
    except Exception as exc:  # noqa: BLE001 - a failed request is data, not a crash
        res.error = f"{type(exc).__name__}: {str(exc)[:300]}"
        return res
    if not res.chunk_s:  # HTTP 200 but no token event: whatever its counts say, no answer
        res.error = "the stream carried no token (no server-sent event with generated text)"
        return res
    if not res.output_tokens:
        res.output_tokens = int(sum(res.chunk_tokens))
    if not finished:  # cut at an event boundary: what came is not the whole answer
        res.error = (
            "the stream ended before the server's last event (no 'stop': true or "
            "finish_reason): the answer was cut short"
        )
        return res
    res.done_s = time.perf_counter() - t0
    return res


def _is_last(cfg: BenchConfig, data: dict[str, Any]) -> bool:
    """Whether ``data`` is a stream's closing event: llama-server's ``"stop": true``, an
    OpenAI choice with its ``finish_reason``."""
    if cfg.api == "llama":
        return bool(data.get("stop"))
    return any(isinstance(c, dict) and c.get("finish_reason") for c in data.get("choices") or [])


def _count(value: object, name: str, most: int | None = None) -> int:
    """A token count the server reported (:func:`specsim.serve.wire.as_count`, at most
    ``most``); anything else (negative, NaN, 1e300 past the request's limit, ``true``, a string)
    fails the request naming the field: a throughput from it would never have been measured."""
    n = as_count(value, most)
    if n is None:
        bound = f", at most {most:,}" if most is not None else ""
        raise StreamError(
            f"the server reported {name} = {value!r}, not a whole number >= 0{bound}; its "
            "counts cannot be trusted"
        )
    return n


def _token(value: object) -> int:
    """A token id the server streamed (:func:`specsim.serve.wire.as_token_id`)."""
    t = as_token_id(value)
    if t is None:
        raise StreamError(f"the server streamed the token id {value!r}, not a token id")
    return t


def _read_final(cfg: BenchConfig, data: dict[str, Any], res: Result, most: int) -> None:
    """The counts a server gives at the end of a stream (tokens, llama-server's timings), each
    checked (:func:`_count`; at most ``most`` generated tokens, the request's own limit)."""
    if cfg.api == "llama":
        t = data.get("timings")
        if t is None:
            t = {}
        if not isinstance(t, dict):
            raise StreamError(f"the server sent timings = {t!r}, not a JSON object")
        if "predicted_n" in t:
            res.output_tokens = _count(t["predicted_n"], "timings.predicted_n", most)
        if "prompt_n" in t:
            res.prompt_tokens = _count(t["prompt_n"], "timings.prompt_n")
        if "draft_n" in t:
            res.draft_n = _count(t["draft_n"], "timings.draft_n")
            res.draft_accepted = _count(t.get("draft_n_accepted", 0), "timings.draft_n_accepted")
            if res.draft_accepted > res.draft_n:
                raise StreamError(
                    f"the server reported timings.draft_n_accepted = {res.draft_accepted} > "
                    f"timings.draft_n = {res.draft_n}: more drafts accepted than drafted"
                )
        if data.get("tokens_evaluated"):
            res.prompt_tokens = _count(data["tokens_evaluated"], "tokens_evaluated")
        return
    usage = data.get("usage")
    if usage is None:
        return
    if not isinstance(usage, dict):
        raise StreamError(f"the server sent usage = {usage!r}, not a JSON object")
    if usage.get("completion_tokens") is not None:
        res.output_tokens = _count(usage["completion_tokens"], "usage.completion_tokens", most)
    if usage.get("prompt_tokens") is not None:
        res.prompt_tokens = _count(usage["prompt_tokens"], "usage.prompt_tokens")


def _server_error(data: dict[str, Any]) -> str | None:
    """The message of an error object a server streamed inside a 200 answer (OpenAI's
    ``{"error": {"message": ...}}``, llama-server's the same), else None."""
    err = data.get("error")
    if err is None:
        return None
    msg = err.get("message", err) if isinstance(err, dict) else err
    return f"the server streamed an error: {str(msg)[:300]}"


async def _closed(client, cfg: BenchConfig, jobs: list[Job], progress,  # noqa: ANN001
                  sent: dict[int, Result]) -> None:  # fmt: skip
    t0 = time.perf_counter()
    nxt = iter(range(len(jobs)))

    async def worker() -> None:
        for i in nxt:
            await _send(client, cfg, i, jobs[i], t0, sent)
            if progress is not None:
                progress.update(1)

    await asyncio.gather(*(worker() for _ in range(min(cfg.concurrency or 1, len(jobs)))))


async def _open(client, cfg: BenchConfig, jobs: list[Job], progress,  # noqa: ANN001
                sent: dict[int, Result]) -> None:  # fmt: skip
    t0 = time.perf_counter()

    async def at(i: int) -> None:
        delay = float(jobs[i].arrival_s or 0.0) - (time.perf_counter() - t0)
        if delay > 0:
            await asyncio.sleep(delay)
        await _send(client, cfg, i, jobs[i], t0, sent)
        if progress is not None:
            progress.update(1)

    await asyncio.gather(*(at(i) for i in range(len(jobs))))


class BenchInterrupted(KeyboardInterrupt):
    """SIGINT (Ctrl-C) or SIGTERM stopped a run: ``results`` holds every request sent (those
    cut short with their ``error`` saying so), ``signum`` the signal. A KeyboardInterrupt, so
    a caller that does not keep the results (the fidelity grid) stops as on Ctrl-C, cleaning
    up on its way out; ``specsim bench`` catches it and writes them."""

    def __init__(self, results: list[Result], signum: int, total: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.results = results
        self.signum = signum
        self.total = total


def run_bench(cfg: BenchConfig, jobs: list[Job], progress: Any = None) -> list[Result]:
    """Send ``jobs`` under ``cfg``'s load; one :class:`Result` per job, in job order.

    SIGINT and SIGTERM stop the client (requests in flight are cancelled, none more is sent)
    and raise :class:`BenchInterrupted` with what was measured, so the caller can keep it; a
    second signal acts as it would without this (the default handlers are back)."""
    try:
        import httpx
    except ImportError:  # pragma: no cover - a core dependency
        raise SpecsimError("specsim bench needs httpx: pip install httpx") from None
    if not jobs:
        raise SpecsimError("no requests to send; give prompts")
    n = len(jobs)
    # one connection per request, never reused: llama-server (cpp-httplib) closes a kept-alive
    # connection after 5 s idle or 100 requests, and a request sent on it as it closes fails
    # with "Server disconnected without sending a response" (2 of 12 requests in a closed loop
    # at C=4, measured); a local connect costs well under a millisecond
    limits = httpx.Limits(max_connections=max(n, 1), max_keepalive_connections=0)
    # connect is httpx's bound; first byte, between events and the whole request are each
    # request's own deadlines (_Bounds), which name the bound they hit
    timeout = httpx.Timeout(None, connect=cfg.connect_timeout_s)
    sent: dict[int, Result] = {}
    stopped: list[int] = []

    async def main() -> None:
        async with httpx.AsyncClient(timeout=timeout, limits=limits) as client:
            load = _open if cfg.rate is not None else _closed
            work = asyncio.ensure_future(load(client, cfg, jobs, progress, sent))
            await await_stoppable(work, stopped)

    asyncio.run(main())
    results = sorted(sent.values(), key=lambda r: r.job)
    if stopped:
        name = signal.Signals(stopped[0]).name
        for r in results:
            if not r.error and not np.isfinite(r.done_s):
                r.error = f"interrupted by {name} before it finished"
        raise BenchInterrupted(results, stopped[0], n)
    return results


# ------------------------------------------------------------------ metrics


def _pct(x: np.ndarray, q: float) -> float:
    x = x[np.isfinite(x)]
    return float(np.percentile(x, q)) if x.size else float("nan")


def _mean(x: np.ndarray) -> float:
    x = x[np.isfinite(x)]
    return float(x.mean()) if x.size else float("nan")


def summarize_bench(
    results: list[Result], concurrency: int | None, slo: dict[str, float] | None = None
) -> dict[str, float]:
    """The replay summary's keys from what the client saw (docs/vllm.md maps them)."""
    ok = [r for r in results if not r.error and np.isfinite(r.done_s)]
    sent = np.array([r.sent_s for r in results])
    first = np.array([r.first_s for r in ok])
    done = np.array([r.done_s for r in ok])
    out_tok = np.array([r.output_tokens for r in ok], dtype=np.float64)
    ttft = (first - np.array([r.sent_s for r in ok])) * 1000.0
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out_tok > 1, (done - first) / (out_tok - 1), np.nan) * 1000.0
    e2e = (done - np.array([r.sent_s for r in ok])) * 1000.0
    gaps, weights = [], []
    for r in ok:  # each chunk after the first: its gap, once per token it carries
        t = np.asarray(r.chunk_s)
        if t.size > 1:
            gaps.append(np.diff(t) * 1000.0)
            weights.append(np.asarray(r.chunk_tokens[1:], dtype=np.float64))
    gap = np.concatenate(gaps) if gaps else np.zeros(0)
    w = np.concatenate(weights) if weights else np.zeros(0)
    span = float(done.max() - sent.min()) if ok else float("nan")
    total = float(out_tok.sum())
    s: dict[str, float] = {
        "requests_completed": len(ok),
        "requests_failed": len(results) - len(ok),
        "output_tokens": int(total),
        "prompt_tokens": int(sum(r.prompt_tokens for r in ok)),
        "duration_s": span,
        "throughput_tok_s": total / span if span > 0 else float("nan"),
        "request_throughput": len(ok) / span if span > 0 else float("nan"),
        "per_user_tps_mean": _mean(1000.0 / tpot),
    }
    for name, x in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)):
        s[f"{name}_ms_mean"] = _mean(x)
        for q in PERCENTILES:
            s[f"{name}_ms_p{q}"] = _pct(x, q)
    s["itl_ms_mean"] = float((gap * w).sum() / w.sum()) if w.sum() else float("nan")
    rep = np.repeat(gap, w.astype(np.int64)) if gap.size else gap
    for q in (*PERCENTILES, 99.9):
        s[f"itl_ms_p{q}"] = _pct(rep, q)
    s["itl_ms_max"] = float(gap.max()) if gap.size else float("nan")
    s.update(_steady(ok, sent, concurrency))
    drafted = [r.draft_n for r in ok if r.draft_n is not None]
    if drafted:
        acc = sum(r.draft_accepted or 0 for r in ok if r.draft_n is not None)
        s["draft_tokens"] = int(sum(drafted))
        s["accepted_draft_tokens"] = int(acc)
        if sum(drafted):  # no draft at all (no n-gram matched): no acceptance rate, not NaN
            s["verify_efficiency"] = acc / sum(drafted)
    if slo:
        good = np.ones(len(ok), dtype=bool)
        for key, x in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)):
            if key in slo:
                good &= np.where(np.isnan(x), True, x <= slo[key])
        s["goodput_req_s"] = float(good.sum()) / span if span > 0 else float("nan")
        s["slo_attainment"] = float(good.mean()) if len(ok) else float("nan")
    return s


def _steady(ok: list[Result], sent: np.ndarray, c: int | None) -> dict[str, float]:
    """A closed loop's steady window, as the simulator's: from the C-th completion to the
    last request sent; tokens streamed inside it over its length."""
    nan = float("nan")
    if c is None or len(ok) < c:
        return {"steady_window_s": nan, "steady_throughput_tok_s": nan}
    t0 = float(np.sort([r.done_s for r in ok])[c - 1])
    t1 = float(sent.max())
    if not t1 > t0:
        return {"steady_window_s": nan, "steady_throughput_tok_s": nan}
    toks = 0
    for r in ok:
        t = np.asarray(r.chunk_s)
        n = np.asarray(r.chunk_tokens)
        toks += int(n[(t >= t0) & (t < t1)].sum())
    return {"steady_window_s": t1 - t0, "steady_throughput_tok_s": toks / (t1 - t0)}


def result_frame(results: list[Result]):  # noqa: ANN201 - pandas.DataFrame
    """One row per request (times in seconds from the run's start)."""
    import pandas as pd

    return pd.DataFrame(
        {
            "job": [r.job for r in results],
            "trace_id": [r.trace_id for r in results],
            "sent_s": [r.sent_s for r in results],
            "first_token_s": [r.first_s for r in results],
            "finish_s": [r.done_s for r in results],
            "prompt_tokens": [r.prompt_tokens for r in results],
            "output_tokens": [r.output_tokens for r in results],
            "chunks": [len(r.chunk_s) for r in results],
            "draft_n": [r.draft_n if r.draft_n is not None else -1 for r in results],
            "draft_accepted": [
                r.draft_accepted if r.draft_accepted is not None else -1 for r in results
            ],
            "error": [r.error for r in results],
        }
    )


def make_jobs(
    prompts: list[str | list[int]],
    cfg: BenchConfig,
    output_len: list[int] | None = None,
) -> list[Job]:
    """The jobs of a run, from specsim's workload generator (the simulator's job order and
    arrivals for the same seed): prompts cycled in a seeded order; a trace's own output
    lengths when given, else ``max_tokens``."""
    from specsim.sim.workload import TraceLengths, synthetic

    n = len(prompts)
    outs = np.asarray(output_len if output_len is not None else [cfg.max_tokens] * n)
    lengths = TraceLengths(np.zeros(n, dtype=np.int64), outs.astype(np.int64))
    requests = cfg.requests or n
    if cfg.rate is not None:
        wl = synthetic(lengths, rate=cfg.rate, cv=cfg.cv, requests=requests, seed=cfg.seed)
        idx, arr = wl.trace_idx, wl.arrival_s
        return [
            Job(prompts[int(i)], int(outs[int(i)]), float(a), int(i))
            for i, a in zip(idx, arr, strict=True)
        ]
    c = cfg.concurrency or 1
    wl = synthetic(lengths, concurrency=c, requests=requests, seed=cfg.seed)
    return [
        Job(prompts[t], int(o), None, int(t)) for t, _p, o in (wl.job(k) for k in range(requests))
    ]
