"""``ReplayConfig``: every knob of a replay besides the trace, in one frozen dataclass.

One place per default: ``replay()`` reads its keyword arguments into this class, the ``replay``
and ``sweep`` commands build their flags from its fields (help text and default from the
field's metadata: :mod:`specsim.options`), and the result's ``config`` is its dict plus what the run
resolved (the profile's capacity defaults, the load's description). Changing a default here
changes it everywhere.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass
from typing import Any

from specsim.errors import SpecsimError
from specsim.options import default_of, help_text
from specsim.options import option as _f

# Gamma arrival gaps need 1 / cv^2 and cv^2 / rate finite and non-zero: beyond these bounds the
# shape or scale underflows (cv 1e-200) or overflows (1e200). One rule for replay and bench.
MIN_CV, MAX_CV = 1e-3, 100.0

# The scheduler a replay runs when none is named: ``auto`` plans each step's draft lengths from
# the cost profile (docs/policies.md), so it does not trap under load as ``hw-aware`` does.
DEFAULT_POLICY = "auto"
# More requests in flight than any server holds: a mistyped 1e30 is refused, not attempted.
MAX_CONCURRENCY = 10_000_000
# Serving model v1 (whole prompts, clairvoyant KV, a full draft every step) was retired; this
# commit is the last that runs it. A saved config or script that asks for it gets this line.
V1_COMMIT = "77e1490"
V1_RETIRED = (
    f"serving model v1 is retired: it runs at commit {V1_COMMIT} (git checkout {V1_COMMIT}); "
    "replay runs serving model v2 only (--serving v2, the default; its step budget is "
    "--max-batched-tokens)"
)


@dataclass(frozen=True)
class ReplayConfig:
    """What a replay runs with (the trace and policy are given beside it)."""

    # -- load: at most one of rate, concurrency, arrivals (none: a closed loop at 1)
    rate: float | None = _f(None, "open-loop Poisson arrivals, requests/s")
    concurrency: int | None = _f(None, "closed loop: C requests in flight (default: 1)")
    arrivals: str | None = _f(
        None, "arrival times from a CSV (Azure format) or azure-conv / azure-code"
    )
    cv: float | None = _f(None, "with --rate: Gamma gaps of this CV (> 1: bursts)")
    requests: int | None = _f(None, "stop after N requests")
    duration: float | None = _f(None, "no arrivals after S simulated seconds")
    # -- the server
    profile: str = _f("llama-3-8b-h100", "cost profile")
    serving: str = _f(
        "v2",
        "serving model: v2, the one model (chunked prefill under a token budget, paged KV with "
        f"preemption, drafting charged by what is drafted, KV read per sequence); v1 was "
        f"retired, it runs at commit {V1_COMMIT}",
        metavar="v2",
    )
    kv: str = _f(
        "paged",
        "KV cache: paged (blocks allocated as tokens arrive, preemption by recompute when "
        "they run out, as vLLM V1) or reserve (prompt + whole output reserved at admission)",
        choices=("paged", "reserve"),
    )
    kv_block: int = _f(16, "paged KV: tokens per block")
    max_batched_tokens: int | None = _f(
        None, "tokens a step may hold, decodes first, prompt chunks fill the rest "
        "(vLLM's max_num_batched_tokens; profile default)",
        type=int,
    )  # fmt: skip
    max_running: int | None = _f(None, "max running requests (profile default)")
    kv_tokens: int | None = _f(None, "KV cache capacity, tokens (profile default)")
    # -- measurement
    seed: int = _f(0, "random seed")
    sla_tps: float | None = _f(None, "per-user tok/s SLA for sla_attainment")
    slo: str | None = _f(
        None,
        "SLOs in ms (ttft, tpot, e2e): goodput = requests/s meeting all of them (DistServe)",
    )
    calibrate: str | None = _f(None, "STS-calibrate on a held-out 30%")
    require_steady: bool = _f(
        False,
        "refuse a closed loop too short to hold its concurrency for a measured window (3C "
        "requests); False (the library's default) runs it with an UnsteadyWarning and NaN "
        "steady-state metrics. The replay command and the reports refuse.",
    )
    # -- what is kept (memory): the per-token log is ~32 bytes per output token
    record_steps: bool = _f(True, "keep the per-step table (104 bytes a step)")
    record_tokens: bool = _f(True, "keep the per-token emission table (~32 bytes a token)")
    # -- streaming results (specsim.sim.streaming): the summary accumulated as requests finish
    stream: bool = _f(
        False,
        "accumulate the summary as requests finish and keep no per-request rows (the result's "
        "requests table is None): counts, means, SLA/SLO shares and goodput are the same to "
        "the bit; percentiles exact up to stream_exact_rows requests, from a DDSketch "
        "(0.5% relative error) beyond. With record_tokens=False (the per-token log grows with "
        "every token) a closed loop's memory stays flat: finished jobs' slots are reused",
        cli=False,
    )
    stream_exact_rows: int = _f(
        100_000, "with stream: exact percentiles up to this many finished requests", cli=False
    )
    requests_out: str | None = _f(
        None,
        "with stream: write the per-request table to this .parquet file in row groups as "
        "requests finish (completion order; written to a temporary name, renamed at the end)",
        cli=False,
    )
    slots: object | None = _f(
        None,
        "a specsim.sim.slots.LlamaSlots (one per trace request's prompt, as the server's "
        "token ids): with a profile that prices a step by the slots it runs in "
        "(passes_by_slot), each request takes the slot llama-server would give it; the same "
        "object handed to run after run carries the server's history. None: the lowest free",
        cli=False,
    )

    def __post_init__(self) -> None:
        loads = [n for n in ("rate", "concurrency", "arrivals") if getattr(self, n) is not None]
        if len(loads) > 1:
            raise SpecsimError(f"give at most one load, not {' and '.join(loads)}")
        if self.cv is not None and self.rate is None:
            raise SpecsimError("--cv/--burstiness shape open-loop arrivals; use them with --rate")
        if self.requests is not None and self.duration is not None:
            raise SpecsimError("give --requests or --duration, not both")
        if self.rate is not None and not (
            isinstance(self.rate, numbers.Real) and math.isfinite(self.rate) and self.rate >= 1e-6
        ):
            raise SpecsimError(
                f"--rate must be a number of requests/s of at least 1e-6, got {self.rate}"
            )  # fmt: skip
        if self.concurrency is not None and (
            isinstance(self.concurrency, bool)
            or not isinstance(self.concurrency, numbers.Real)
            or not math.isfinite(self.concurrency)
            or int(self.concurrency) != self.concurrency
            or not 1 <= self.concurrency <= MAX_CONCURRENCY
        ):
            raise SpecsimError(
                f"--concurrency must be a whole number of requests in flight in [1, "
                f"{MAX_CONCURRENCY:,}], got {self.concurrency}"
            )
        if self.requests is not None and (
            isinstance(self.requests, bool)
            or not isinstance(self.requests, numbers.Real)
            or int(self.requests) != self.requests
            or self.requests < 1
        ):
            raise SpecsimError(
                f"--requests must be a whole number of at least 1, got {self.requests}"
            )
        if self.duration is not None and not (
            isinstance(self.duration, numbers.Real) and math.isfinite(self.duration)
            and self.duration >= 1e-3
        ):  # fmt: skip
            raise SpecsimError(
                f"--duration must be simulated seconds, at least 0.001, got {self.duration}"
            )
        if self.sla_tps is not None and not (math.isfinite(self.sla_tps) and self.sla_tps > 0):
            raise SpecsimError(f"--sla-tps must be a positive number, got {self.sla_tps}")
        if self.serving == "v1":
            raise SpecsimError(V1_RETIRED)
        if self.serving != "v2":
            raise SpecsimError(
                f"--serving must be v2 (the one serving model), got {self.serving!r}"
            )
        if self.kv not in ("paged", "reserve"):
            raise SpecsimError(f"--kv must be paged or reserve, got {self.kv!r}")
        for name in (
            "max_running",
            "kv_tokens",
            "max_batched_tokens",
            "kv_block",
        ):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or int(v) != v or v < 1):
                flag = "--" + name.replace("_", "-")
                raise SpecsimError(f"{flag} must be a positive integer, got {v}")
        if self.requests_out is not None and not self.stream:
            raise SpecsimError("requests_out streams the per-request table: pass stream=True")
        if self.requests_out is not None and not str(self.requests_out).lower().endswith(
            ".parquet"
        ):
            raise SpecsimError(f"requests_out must be a .parquet file, got {self.requests_out!r}")
        if isinstance(self.stream_exact_rows, bool) or not (
            isinstance(self.stream_exact_rows, numbers.Integral) and self.stream_exact_rows >= 0
        ):
            raise SpecsimError(
                f"stream_exact_rows must be a whole number >= 0, got {self.stream_exact_rows!r}"
            )
        if self.calibrate not in (None, "sts"):
            raise SpecsimError(f"unknown calibration {self.calibrate!r}; the only one is 'sts'")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def flag_help(name: str) -> str:
    """A field's help text with its default, for argparse (``--name``'s help)."""
    return help_text(ReplayConfig, name)


def default(name: str) -> Any:
    """A field's default (argparse ``default=``)."""
    return default_of(ReplayConfig, name)
