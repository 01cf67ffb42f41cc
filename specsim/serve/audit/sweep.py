"""Audits where the bugs live: draft depth x concurrency x temperature, one verdict table.

Why: the shipped DSpark bugs hid in one corner each: one draft depth (the checkpoint's block
size), requests that share a step, a quantized target's batch kernel. One audit at one setting
sees none of them. A sweep starts the audited llama-server once per (speculative kind, depth)
(llama-server b11434 takes no per-request speculative parameters: its ``speculative.n_max``
request field is compiled out, tools/server/server-schema.cpp, so the depth needs a restart),
and audits it at every concurrency (the other requests in flight are the batch mates) and every
temperature: T = 0 by greedy identity with triage (``greedy``), T > 0 by the output law
(``law``). False alarms stay controlled over the whole sweep: each T > 0 audit spends 1e-6 / m
of the family's rate (m: the sweep's T > 0 cells); a T = 0 bug verdict is a confident
divergence above the numerics null's threshold, which the null sets once for the sweep.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specsim.errors import SpecsimError


@dataclass(frozen=True)
class Kind:
    """One speculative configuration of the audited server, its depth set per cell."""

    name: str
    flags: tuple[str, ...]  # llama-server flags, depth excluded
    depth_flag: str | None = None  # None: the kind has no depth (speculation off)

    def args(self, depth: int | None) -> tuple[str, ...]:
        if self.depth_flag is None or depth is None:
            return self.flags
        return (*self.flags, self.depth_flag, str(depth))


@dataclass(frozen=True)
class SweepSpec:
    """The grid and each cell's budget."""

    model: Path
    kinds: tuple[Kind, ...]
    depths: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7)
    concurrencies: tuple[int, ...] = (1, 2, 4)
    temperatures: tuple[float, ...] = (0.0, 1.0)
    n_predict: int = 32
    greedy_requests: int = 32  # per T = 0 cell
    law_tokens: int = 1024  # positions per T > 0 cell
    minutes: float | None = None  # per cell
    server_args: tuple[str, ...] = ("-c", "8192", "-t", "1", "--no-warmup")
    mutant: str | None = None  # a proxy mutant in front of every audited server
    null_positions: int = 128
    seed: int = 0
    stop_on_bug: bool = False  # T = 0 cells: start no request after the first confident one

    def __post_init__(self) -> None:
        if not self.kinds or not self.depths or not self.concurrencies or not self.temperatures:
            raise SpecsimError("a sweep needs at least one kind, depth, concurrency, temperature")
        if any(c < 1 for c in self.concurrencies) or any(d < 1 for d in self.depths):
            raise SpecsimError("depths and concurrencies must be >= 1")
        if any(not (math.isfinite(t) and t >= 0) for t in self.temperatures):
            raise SpecsimError("temperatures must be finite and >= 0")

    def cells(self) -> Iterator[tuple[Kind, int | None, int, float]]:
        for k in self.kinds:
            for d in self.depths if k.depth_flag else (None,):
                for c in self.concurrencies:
                    for t in self.temperatures:
                        yield k, d, c, t

    @property
    def law_cells(self) -> int:
        return sum(1 for *_, t in self.cells() if t > 0)


@dataclass
class SweepRow:
    kind: str
    depth: int | None
    concurrency: int
    temperature: float
    verdict: str
    positions: int
    requests: int
    minutes: float
    detail: dict[str, Any] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        base = {
            "kind": self.kind, "depth": self.depth if self.depth is not None else 0,
            "concurrency": self.concurrency, "temperature": self.temperature,
            "verdict": self.verdict, "positions": self.positions, "requests": self.requests,
            "minutes": self.minutes,
        }  # fmt: skip
        return {**base, **self.detail}


def _law_cell(url: str, ref: str, kind: Kind, c: int, t: float, spec: SweepSpec,
              alpha: float) -> SweepRow:  # fmt: skip
    from specsim.serve.audit.config import AuditConfig
    from specsim.serve.audit.law import run_audit

    cfg = AuditConfig(
        server=url, reference=ref, temperature=t, n_predict=spec.n_predict,
        tokens=spec.law_tokens, minutes=spec.minutes, concurrency=c, seed=spec.seed,
        alpha_run=alpha, label=kind.name, reference_model=None,
    )  # fmt: skip
    res = run_audit(cfg)
    return SweepRow(
        kind.name, None, c, t, res.verdict, res.positions, res.generations, res.minutes,
        {"rank_p": res.rank_p, "pit_p": res.pit_p, "top1_p": res.top1_p,
         "tv_floor_99": res.tv_floor_99, "top1_floor_99": res.top1_floor_99,
         "alpha_run": alpha, "evidence": res.evidence, "accepted_share": res.accepted_share},
    )  # fmt: skip


def _greedy_cell(url: str, ref: str, kind: Kind, c: int, spec: SweepSpec, setup: Any) -> SweepRow:
    from specsim.serve.audit.greedy import GreedySpec, run_greedy_async

    prompts, banned, null, n_slots = setup
    g = GreedySpec(
        server=url, reference=ref, prompts=prompts, n_predict=spec.n_predict,
        requests=spec.greedy_requests, minutes=spec.minutes, concurrency=c,
        ref_slots=n_slots, banned=banned, seed=spec.seed, label=kind.name,
        stop_on_bug=spec.stop_on_bug,
    )  # fmt: skip
    res = asyncio.run(run_greedy_async(g, null))
    row = res.row()
    first = res.bugs[0] if res.bugs else None
    detail = {k: row[k] for k in ("divergences", "near_ties", "bugs", "reference_disagreements",
                                  "floor_request_share_99", "floor_position_rate_99", "tau",
                                  "accepted_share")}  # fmt: skip
    detail["evidence"] = (
        f"job {first.job} position {first.position} ({first.role}, step drafting "
        f"{first.step_drafted}): expected {first.expected}, emitted {first.emitted}, reference "
        f"margin {first.ref_margin:.3g}"
        if first
        else ""
    )
    detail["divergence_rows"] = [d.row() for d in res.divergences]
    detail["null"] = null.summary()
    detail["null_object"] = null  # for a later sweep to reuse
    return SweepRow(kind.name, None, c, 0.0, res.verdict, res.positions, res.requests,
                    res.minutes, detail)  # fmt: skip


def run_sweep(spec: SweepSpec, progress: Callable[[str], None] | None = None,
              null: Any = None,
              on_row: Callable[[SweepRow], None] | None = None) -> list[SweepRow]:  # fmt: skip
    """Every cell of ``spec``; one reference llama-server (speculation off) for all of them.
    ``null``: a numerics null measured before (same model and reference flags) to reuse;
    ``on_row``: called with each cell's row as it finishes (write as you go: a sweep is long)."""
    from specsim.serve.audit.config import AuditConfig
    from specsim.serve.audit.greedy import prepare
    from specsim.serve.audit.proxy import MutantProxy
    from specsim.serve.llama_server import LlamaServer, ServerSpec

    say = progress or (lambda _msg: None)
    m = spec.law_cells
    alpha = 1e-6 / max(m, 1)
    n_ref = max(2, max(spec.concurrencies))
    rows: list[SweepRow] = []
    ref_args = (*spec.server_args, "-np", str(n_ref))
    with LlamaServer(ServerSpec(model=spec.model, args=ref_args)) as ref:
        setup = None
        if 0.0 in spec.temperatures:
            cfg = AuditConfig(
                reference_model=str(spec.model), temperature=0.0, n_predict=spec.n_predict,
                null_positions=spec.null_positions,
            )  # fmt: skip
            setup = asyncio.run(prepare(cfg, ref.url, null))
            say(f"numerics null: {setup[2].summary()}")
        by_server: dict[tuple[str, int | None], list[tuple[int, float]]] = {}
        for k, d, c, t in spec.cells():
            by_server.setdefault((k.name, d), []).append((c, t))
        kinds = {k.name: k for k in spec.kinds}
        for (name, d), cts in by_server.items():
            kind = kinds[name]
            args = (*spec.server_args, "-np", str(max(spec.concurrencies)), *kind.args(d))
            with LlamaServer(ServerSpec(model=spec.model, args=args)) as srv:
                with _maybe_proxy(srv.url, spec, MutantProxy) as url:
                    for c, t in cts:
                        if t == 0:
                            r = _greedy_cell(url, ref.url, kind, c, spec, setup)
                        else:
                            r = _law_cell(url, ref.url, kind, c, t, spec, alpha)
                        r.depth = d
                        rows.append(r)
                        if on_row is not None:
                            on_row(r)
                        say(f"{name} depth {d} c={c} T={t:g}: {r.verdict} ({r.positions:,} "
                            f"positions, {r.minutes:.1f} min)")  # fmt: skip
    return rows


class _maybe_proxy:  # noqa: N801 - used as a context manager
    def __init__(self, url: str, spec: SweepSpec, cls: Any) -> None:
        self.url, self.spec, self.cls, self.px = url, spec, cls, None

    def __enter__(self) -> str:
        if self.spec.mutant is None:
            return self.url
        self.px = self.cls(self.url, self.spec.mutant, seed=self.spec.seed)
        return self.px.__enter__().url

    def __exit__(self, *exc: object) -> None:
        if self.px is not None:
            self.px.__exit__(*exc)


def verdict_table(rows: list[SweepRow]) -> Any:
    """The tidy verdict table (one row per cell; divergences kept in their own table)."""
    import pandas as pd

    hidden = ("divergence_rows", "null", "null_object")
    return pd.DataFrame([{k: v for k, v in r.row().items() if k not in hidden} for r in rows])


def divergence_table(rows: list[SweepRow]) -> Any:
    """Every divergence of every T = 0 cell, with the cell it came from (the reproducers)."""
    import pandas as pd

    out = []
    for r in rows:
        for d in r.detail.get("divergence_rows", []):
            out.append({"kind": r.kind, "depth": r.depth or 0, "concurrency": r.concurrency, **d})
    return pd.DataFrame(out)
