"""What ``specsim bench`` is run with (``BenchConfig``: its flags and saved config) and what it
records per request. Kept apart from the runner so that ``specsim --help`` imports no numpy."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from specsim.errors import SpecsimError
from specsim.options import option
from specsim.sim.config import MAX_CV, MIN_CV

APIS = ("llama", "completions", "chat")


@dataclass(frozen=True)
class BenchConfig:
    """How a server is loaded (the ``specsim bench`` flags and the saved config)."""

    url: str = option("http://127.0.0.1:8080", "server base URL")
    api: str = option("llama", "llama (/completion), completions or chat (/v1/...)", choices=APIS)
    model: str | None = option(None, "model name for /v1 APIs", type=str)
    concurrency: int | None = option(None, "closed loop: C requests in flight", type=int)
    rate: float | None = option(None, "open-loop Poisson arrivals, requests/s", type=float)
    cv: float | None = option(None, "with --rate: Gamma gaps of this CV", type=float)
    requests: int | None = option(None, "requests to send (default: one per prompt)", type=int)
    max_tokens: int = option(128, "tokens to generate per request (a trace's own lengths win)")
    ignore_eos: bool = option(
        True, "generate exactly max_tokens (llama-server, vLLM): lengths do not depend on EOS"
    )
    temperature: float = option(0.0, "sampling temperature")
    seed: int = option(0, "seed of the job order and arrivals (and of the server's sampling)")
    slo: str | None = option(None, "SLOs in ms, e.g. ttft=500,tpot=50 (goodput)", type=str)
    timeout_s: float = option(600.0, "a whole request, send to last event, at most (seconds)")
    connect_timeout_s: float = option(30.0, "a connection to the server, at most (seconds)")
    first_byte_timeout_s: float = option(
        300.0, "from sending a request to its first streamed event, at most (seconds; "
        "queueing and prefill included)"
    )  # fmt: skip
    event_timeout_s: float = option(
        60.0, "between two streamed events of a request, at most (seconds)"
    )
    max_failed_share: float = option(
        0.0, "share of requests that may fail before the run is a failure (exit 1)"
    )

    def __post_init__(self) -> None:
        loads = [n for n in ("concurrency", "rate") if getattr(self, n) is not None]
        if len(loads) > 1:
            raise SpecsimError("give --concurrency or --rate, not both")
        if self.concurrency is not None and self.concurrency < 1:
            raise SpecsimError(f"--concurrency must be >= 1, got {self.concurrency}")
        if self.rate is not None and not (math.isfinite(self.rate) and self.rate > 0):
            raise SpecsimError(f"--rate must be a positive number, got {self.rate}")
        if self.cv is not None and self.rate is None:
            raise SpecsimError("--cv shapes open-loop arrivals; use it with --rate")
        if self.max_tokens < 1:
            raise SpecsimError(f"--max-tokens must be at least 1, got {self.max_tokens}")
        if self.api not in APIS:
            raise SpecsimError(f"--api must be one of {', '.join(APIS)}, got {self.api!r}")
        check_url(self.url)
        if self.requests is not None and not 1 <= self.requests <= MAX_REQUESTS:
            raise SpecsimError(
                f"--requests must be a whole number in [1, {MAX_REQUESTS:,}], got {self.requests}"
            )
        if self.max_tokens > MAX_TOKENS:
            raise SpecsimError(
                f"--max-tokens must be at most {MAX_TOKENS:,}, got {self.max_tokens}"
            )
        if self.rate is not None and self.rate < MIN_RATE:
            raise SpecsimError(
                f"--rate {self.rate:g} req/s would take more than {1 / MIN_RATE:,.0f} s between "
                f"requests; give a rate >= {MIN_RATE:g}"
            )
        if self.cv is not None and not (math.isfinite(self.cv) and MIN_CV <= self.cv <= MAX_CV):
            raise SpecsimError(
                f"--cv must be a coefficient of variation in [{MIN_CV:g}, {MAX_CV:g}] (1 is "
                f"Poisson), got {self.cv}"
            )
        for name in TIMEOUTS:
            v = getattr(self, name)
            if not (math.isfinite(v) and 0 < v <= MAX_TIMEOUT_S):
                flag = "--" + name.replace("_", "-")
                raise SpecsimError(f"{flag} must be seconds in (0, {MAX_TIMEOUT_S:,.0f}], got {v}")
        if not (math.isfinite(self.temperature) and 0 <= self.temperature <= 100):
            raise SpecsimError(
                f"--temperature must be a number in [0, 100], got {self.temperature}"
            )
        if not (math.isfinite(self.max_failed_share) and 0 <= self.max_failed_share <= 1):
            raise SpecsimError(
                f"--max-failed-share must be a share in [0, 1], got {self.max_failed_share}"
            )


MAX_REQUESTS = 10_000_000
MAX_TOKENS = 1_000_000
MIN_RATE = 1e-3  # one request per 1,000 s: slower is a typo, and would look like a hang
MAX_TIMEOUT_S = 86_400.0
# the time bounds of one request (each its own flag): a server that stalls anywhere is a failed
# request naming the bound it hit, never a run that waits forever
TIMEOUTS = ("timeout_s", "connect_timeout_s", "first_byte_timeout_s", "event_timeout_s")


def check_url(url: str, flag: str = "--url") -> None:
    """A base URL a client can connect to: http(s), a host, a port in 1..65535 (one line
    naming ``flag``). Every real-server command checks its URLs here before connecting.

    Refused too, because the client would otherwise send somewhere the user did not mean (or
    fail later with a message that hides the typo): whitespace or control characters (a pasted
    newline), a backslash (``http://h:1\\@evil`` is host ``evil`` to the client, ``h`` to a
    browser), a query or fragment (every request's path is appended after the base), a host
    label over 63 characters, and a bracketed host that is not an IPv6 address."""
    from urllib.parse import urlsplit

    example = "e.g. http://127.0.0.1:8080"
    if not url.lower().startswith(("http://", "https://")):
        raise SpecsimError(f"{flag} {url!r} must start with http:// or https://; {example}")
    bad = next((i for i, ch in enumerate(url) if ch.isspace() or not ch.isprintable()), None)
    if bad is not None:
        raise SpecsimError(
            f"{flag} {url!r} has whitespace or a control character at position {bad} "
            f"(a pasted newline or tab?); {example}"
        )
    if "\\" in url:
        raise SpecsimError(f"{flag} {url!r} has a backslash; use / in a URL; {example}")
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # an unclosed [ or a bracketed host that is not IPv6
        raise SpecsimError(
            f"{flag} {url!r} is not a URL ({exc}); write an IPv6 host in brackets "
            f"(http://[::1]:8080), any other without; {example}"
        ) from None
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise SpecsimError(
            f"{flag} {url!r} has a query or fragment; give the server's base URL only, {example}"
        )
    host = parts.hostname or ""
    if not host:
        raise SpecsimError(f"{flag} {url!r} names no host; {example}")
    if not host.startswith("[") and ":" not in host:
        if len(host) > 253 or any(len(label) > 63 for label in host.split(".")):
            raise SpecsimError(
                f"{flag} {url!r} has a host name over 253 characters or a label (between dots) "
                f"over 63: no such host can exist; {example}"
            )
    try:
        port = parts.port
    except ValueError as exc:  # 99999; or "+80", "80:80", "８０" (not a number at all)
        what = "outside" if "out of range" in str(exc) else "that is not a number in"
        raise SpecsimError(f"{flag} {url!r} has a port {what} 1..65535; {example}") from None
    if port is not None and not 1 <= port <= 65535:
        raise SpecsimError(f"{flag} {url!r} has a port outside 1..65535; {example}")


@dataclass(frozen=True)
class Job:
    """One request to send: its prompt (text or token ids), tokens to generate, and (open
    loop) when to send it, seconds from the start."""

    prompt: str | list[int]
    max_tokens: int
    arrival_s: float | None = None
    trace_id: int = -1


@dataclass
class Result:
    """What one request did, on the client's clock (seconds from the run's start)."""

    job: int
    trace_id: int
    sent_s: float
    first_s: float = float("nan")
    done_s: float = float("nan")
    chunk_s: list[float] = field(default_factory=list)  # arrival of each streamed chunk
    chunk_tokens: list[int] = field(default_factory=list)  # tokens in it (1 unless known)
    tokens: list[int] = field(default_factory=list)  # the output's token ids, where streamed
    output_tokens: int = 0
    prompt_tokens: int = 0
    draft_n: int | None = None  # llama-server timings: tokens drafted ...
    draft_accepted: int | None = None  # ... and accepted
    error: str = ""
