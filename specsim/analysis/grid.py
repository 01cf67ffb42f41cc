"""The cells of a sweep and the seed each one runs with.

A sweep is the product traces x policies x loads x seed replicates. Each cell gets its seed from
``(base seed, trace content, load, replicate)`` and NOT from the policy or the cost profile:
every policy (and profile) at one load sees the same arrivals and the same sampled requests
(common random numbers), so the difference between two policies is the policy, not the dice.
Because the seed is a pure function of the cell, a cell gives the same row whether it runs
locally, on a Dask worker, or in a resumed run.
"""

from __future__ import annotations

import hashlib
import json
import math
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specsim.errors import SpecsimError

LOAD_KINDS = ("concurrency", "rate", "arrivals")


@dataclass(frozen=True)
class Cell:
    """One replay of a sweep: every knob that changes its result is a field."""

    trace: str  # path of the trace file, as given
    policy: str
    load_kind: str  # "concurrency" (closed loop) or "rate" (requests/s, open loop)
    load: float
    replicate: int  # 0 .. seeds-1
    profile: str
    base_seed: int = 0
    requests: int | None = None
    duration: float | None = None
    options: tuple[tuple[str, Any], ...] = field(default_factory=tuple)  # extra replay kwargs
    trace_digest: str = ""  # content hash: a changed file at the same path is a new cell

    @property
    def trace_name(self) -> str:
        """The trace's file stem (``traces/chat.parquet`` -> ``chat``): the table's label."""
        return Path(self.trace).stem

    def _coords(self, with_policy: bool) -> dict[str, Any]:
        d: dict[str, Any] = {
            # the seed follows the trace's content (a copied file gives the same results); the
            # key names the file (not its folder: a clone elsewhere, or the installed package,
            # resumes the same cells) beside its content hash
            "trace": (Path(self.trace).name if self.trace_digest else self.trace)
            if with_policy or not self.trace_digest
            else self.trace_digest,
            "load_kind": self.load_kind,
            "load": _num(self.load),
            "replicate": self.replicate,
            "base_seed": self.base_seed,
            "requests": self.requests,
            "duration": _num(self.duration),
            "options": [[k, _num(v)] for k, v in self.options],
        }
        if with_policy:
            d["policy"] = self.policy
            d["profile"] = self.profile
            d["trace_digest"] = self.trace_digest
        return d

    @property
    def key(self) -> str:
        """A stable text id of the cell (what a resumed sweep matches finished rows by); it
        includes the trace's content hash, so rows of an edited trace are never reused."""
        return json.dumps(self._coords(True), sort_keys=True, separators=(",", ":"))

    @property
    def key_hash(self) -> str:
        return hashlib.sha1(self.key.encode("utf-8")).hexdigest()[:20]

    @property
    def seed(self) -> int:
        """The replay seed: from everything but the policy and profile (common random numbers)."""
        text = json.dumps(self._coords(False), sort_keys=True, separators=(",", ":"))
        ss = np.random.SeedSequence([int(self.base_seed), zlib.crc32(text.encode("utf-8"))])
        return int(ss.generate_state(1, dtype=np.uint32)[0] >> 1)

    def replay_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :func:`specsim.sim.simulate.replay` for this cell."""
        kw: dict[str, Any] = dict(self.options)
        kw["profile"] = self.profile
        kw["seed"] = self.seed
        if self.load_kind == "concurrency":
            kw["concurrency"] = int(self.load)
        elif self.load_kind == "rate":
            kw["rate"] = float(self.load)
        # "arrivals": the load is the arrivals file, in the options
        if self.requests is not None:
            kw["requests"] = int(self.requests)
        if self.duration is not None:
            kw["duration"] = float(self.duration)
        return kw

    def knobs(self) -> dict[str, Any]:
        """The cell's columns in the tidy result table."""
        row: dict[str, Any] = {
            "trace": self.trace_name,
            "trace_path": self.trace,
            "trace_sha1": self.trace_digest,
            "policy": self.policy,
            "profile": self.profile,
            "load_kind": self.load_kind,
            "load": float(self.load),
            "concurrency": float(self.load) if self.load_kind == "concurrency" else math.nan,
            "rate": float(self.load) if self.load_kind == "rate" else math.nan,
            "replicate": int(self.replicate),
            "base_seed": int(self.base_seed),
            "seed": self.seed,
            "requests": float(self.requests) if self.requests is not None else math.nan,
            "duration": float(self.duration) if self.duration is not None else math.nan,
        }
        for k, v in self.options:
            row[k] = v
        row["cell_key"] = self.key
        return row


def file_digest(path: str | Path) -> str:
    """First 16 hex digits of the SHA-1 of a file's bytes."""
    h = hashlib.sha1()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def _num(x: Any) -> Any:
    """Canonical number for keys: 4 and 4.0 are the same load."""
    if isinstance(x, float) and x.is_integer():
        return int(x)
    return x


def make_grid(
    traces: list[str],
    policies: list[str],
    loads: list[float],
    *,
    load_kind: str = "concurrency",
    seeds: int = 1,
    profile: str = "llama-3-8b-h100",
    base_seed: int = 0,
    requests: int | None = None,
    duration: float | None = None,
    options: dict[str, Any] | None = None,
    digests: dict[str, str] | None = None,
    requests_per_concurrency: float | None = None,
) -> list[Cell]:
    """Every cell of the sweep, in a fixed order (trace, policy, load, replicate).

    ``requests_per_concurrency`` = k: a closed-loop cell at C runs max(requests, ceil(k C))
    requests (k >= 3 gives every load a steady window: C to warm up, C measured, C to drain)."""
    if load_kind not in LOAD_KINDS:
        raise SpecsimError(f"load kind {load_kind!r} is not one of {', '.join(LOAD_KINDS)}")
    if not traces:
        raise SpecsimError("no trace given; pass at least one trace file")
    if not policies:
        raise SpecsimError("no policy given; pass --policies a,b,c")
    if not loads:
        raise SpecsimError("no load given; pass --concurrency 1,2,4 or --rates 1,2,4")
    if seeds < 1:
        raise SpecsimError(f"--seeds must be at least 1, got {seeds}")
    for x in loads:
        if not (x > 0 and math.isfinite(x)):
            raise SpecsimError(f"load {x} must be a positive number")
        if load_kind == "concurrency" and float(x) != int(x):
            raise SpecsimError(f"concurrency {x} must be a whole number of requests")
    for name, seq in (("trace", traces), ("policy", policies), ("load", loads)):
        if len(set(seq)) != len(seq):
            raise SpecsimError(f"a {name} is listed twice in the sweep; list each once")
    opts = tuple(sorted((options or {}).items()))
    return [
        Cell(
            trace=t,
            policy=p,
            load_kind=load_kind,
            load=float(x),
            replicate=r,
            profile=profile,
            base_seed=int(base_seed),
            requests=_cell_requests(requests, requests_per_concurrency, load_kind, x),
            duration=duration,
            options=opts,
            trace_digest=(digests or {}).get(t, ""),
        )
        for t in traces
        for p in policies
        for x in loads
        for r in range(seeds)
    ]


def _cell_requests(
    requests: int | None, per_c: float | None, load_kind: str, load: float
) -> int | None:
    if per_c is None or load_kind != "concurrency":
        return requests
    return max(int(requests or 0), math.ceil(per_c * float(load)))


def parse_numbers(text: str, what: str = "list") -> list[float]:
    """``"1,2,4"`` -> [1, 2, 4]; ``"1,2,4,...,64"`` continues the progression up to and
    including the last number: geometric when the three numbers before ``...`` have a constant
    ratio (1,2,4), else arithmetic from the last two (10,20,...,100)."""
    from specsim.options import split_items

    parts = split_items(text, what)
    out: list[float] = []
    i = 0
    while i < len(parts):
        p = parts[i]
        if p == "...":
            if len(out) < 2 or i + 1 >= len(parts):
                raise SpecsimError(
                    f"{what} {text!r}: '...' needs two numbers before it and one after, "
                    "e.g. 1,2,4,...,256"
                )
            end = _float(parts[i + 1], what, text)
            out.extend(_progression(out[-3:], end, what, text))
            i += 2
            continue
        out.append(_float(p, what, text))
        i += 1
    return out


def _float(p: str, what: str, text: str) -> float:
    try:
        v = float(p)
    except ValueError:
        raise SpecsimError(f"{what} {text!r}: {p!r} is not a number") from None
    if not math.isfinite(v):
        raise SpecsimError(f"{what} {text!r}: {p!r} is not a finite number")
    return v


# The most values one '...' may add: counted before any is built, so a mistyped range
# (1,2,...,1e9 or 1,1.0000000001,...,2) is refused at once instead of filling memory.
MAX_EXPANSION = 10_000


def _check_count(n: float, what: str, text: str) -> None:
    if not math.isfinite(n) or n > MAX_EXPANSION:
        raise SpecsimError(
            f"{what} {text!r}: '...' would expand to more than {MAX_EXPANSION:,} values; "
            "give a coarser progression (e.g. 1,2,4,...,256)"
        )


def _progression(head: list[float], end: float, what: str, text: str) -> list[float]:
    a, b = head[-2], head[-1]
    geometric = (
        len(head) == 3
        and head[0] > 0
        and a > head[0]
        and math.isclose(a / head[0], b / a)
        and not math.isclose(a - head[0], b - a)
    )
    if geometric and end > b:
        ratio = b / a
        _check_count(math.log(end / b) / math.log(ratio), what, text)
        vals, x = [], b
        while True:
            x *= ratio
            if x > end * (1 + 1e-9):
                break
            vals.append(float(round(x, 9)))
        if not vals or not math.isclose(vals[-1], end):
            vals.append(end)
        return vals
    step = b - a
    if step <= 0 or end <= b:
        raise SpecsimError(f"{what} {text!r}: '...' must continue an increasing progression")
    _check_count((end - b) / step, what, text)
    n = math.floor((end - b) / step + 1e-9)
    vals = [float(round(b + step * (k + 1), 9)) for k in range(n)]
    if not vals or not math.isclose(vals[-1], end):
        vals.append(end)
    return vals
