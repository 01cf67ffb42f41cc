"""The server audit at T = 0: greedy identity, every divergence triaged by the reference's margin.

Why a greedy audit: at temperature 0 a lossless speculative server must emit, at every
position, the token the same model without speculation ranks first. That is checked token for
token, so it needs no statistics and catches a bug that touches a small share of requests or one
draft depth, which a law test at T > 0 needs tens of thousands of positions to see. What it
cannot do naively is tell a bug from numerics: a verification batch runs other kernels than a
single-token decode (on a quantized CPU target here, the two paths' top-1 minus top-2 margins
differ by up to about half a nat), so near-ties flip with no bug at all (llama.cpp #25618).

How: for each request the audited server's tokens are compared with the reference's greedy
tokens at the same prefix (the reference regenerates after every divergence from the audited
prefix, so every emitted token is compared). At each divergence the reference's own law is read
there; the divergence is

- ``near-tie (numerics)`` when its margin (top-1 minus top-2 log-probability) is within the
  numerics threshold ``tau``, which the null measures: the margins of the same positions read
  through the reference's two paths (one decode after a cached prefix; the whole prefix as one
  batch, in another slot), ``tau = NULL_FACTOR x`` the largest difference seen (at least
  ``TAU_FLOOR``); a flip needs the paths' margins to have opposite signs, so a margin above
  every path difference the null saw is not numerics of that kind;
- ``confident divergence (bug)`` otherwise, with a reproducer: prompt, position, place in the
  speculative step, expected and emitted tokens, both margins (the reference's, and the audited
  server's own law at that prefix through its non-speculative path).

A position where the reference's decode and its law disagree (its argmax is the emitted token)
is not a divergence of the audited server; it is counted apart.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from specsim.errors import SpecsimError
from specsim.serve.audit.client import (
    Generation,
    Sampling,
    generate_llama,
    within,
)
from specsim.serve.audit.margins import greedy_tokens, margin_at
from specsim.serve.stoppable import AuditInterrupted, gather_all, run_stoppable

NULL_FACTOR = 2.0  # tau = this x the largest path difference the null saw
TAU_FLOOR = 0.05  # nats: never call a divergence a bug below this margin
NEAR_TIE = "near-tie (numerics)"
BUG = "confident divergence (bug)"


@dataclass(frozen=True)
class Null:
    """The numerics null: margin differences between the reference's two paths."""

    positions: int
    deltas: np.ndarray  # |margin(decode) - margin(batch)| (sum of both when the argmax differs)
    margins: np.ndarray  # the decode path's margin at each null position
    tau: float

    @property
    def confident_share(self) -> float:
        """Share of positions whose margin exceeds tau: where a wrong token reads as a bug."""
        return float(np.mean(self.margins > self.tau)) if self.margins.size else float("nan")

    def summary(self) -> dict[str, Any]:
        d = self.deltas
        q = np.quantile(d, [0.5, 0.99]) if d.size else [math.nan, math.nan]
        return {
            "null_positions": self.positions, "null_delta_median": float(q[0]),
            "null_delta_p99": float(q[1]), "null_delta_max": float(d.max()) if d.size else math.nan,
            "tau": self.tau, "confident_share": self.confident_share,
        }  # fmt: skip


def tau_from(deltas: np.ndarray, factor: float = NULL_FACTOR, floor: float = TAU_FLOOR) -> float:
    """The numerics threshold: ``factor`` x the largest path difference, at least ``floor``."""
    d = np.asarray(deltas, dtype=np.float64)
    return float(max(floor, factor * float(d.max()) if d.size else floor))


@dataclass
class Divergence:
    """One emitted token that is not the reference's argmax at its prefix: the reproducer."""

    job: int
    context: int
    position: int
    role: str  # place in the speculative step (stats.ROLES)
    step_index: int  # 0-based place of the token in its verification step (-1: plain)
    step_drafted: int  # drafts of that step (0: plain)
    expected: int
    emitted: int
    ref_margin: float  # reference: log p(top-1) - log p(top-2) at the prefix
    emitted_gap: float  # reference: log p(top-1) - log p(emitted)
    audited_margin: float  # audited server's own non-speculative law: top-1 minus top-2
    audited_argmax: int  # ... and its argmax there
    klass: str
    prefix: list[int] = field(default_factory=list)
    found_minutes: float = math.nan  # when the audit found it (minutes from its start)

    def row(self) -> dict[str, Any]:
        d = asdict(self)
        d["prefix_len"] = len(d["prefix"])  # the prefix itself: the reproducer's prompt
        return d


@dataclass
class GreedyResult:
    """The verdict of one greedy audit and what it covers."""

    label: str
    verdict: str  # "identical" | "near-ties only (numerics)" | "BUG"
    requests: int
    positions: int
    concurrency: int
    divergences: list[Divergence]
    reference_disagreements: int
    null: dict[str, Any]
    minutes: float
    spec_types: str = ""
    accepted_share: float = math.nan
    drafted_by_step: dict[int, int] = field(default_factory=dict)

    @property
    def bugs(self) -> list[Divergence]:
        return [d for d in self.divergences if d.klass == BUG]

    @property
    def lossy(self) -> bool:
        return bool(self.bugs)

    def floors(self) -> tuple[float, float]:
        """The smallest share of requests, and of positions, with a confident wrong token that
        this run would have caught with 99% power (1 - 0.01^(1/n); positions counted where the
        null says a margin exceeds tau)."""
        req = 1.0 - 0.01 ** (1.0 / self.requests) if self.requests else math.nan
        n_conf = self.positions * float(self.null.get("confident_share", math.nan))
        pos = 1.0 - 0.01 ** (1.0 / n_conf) if n_conf >= 1 else math.nan
        return req, pos

    def row(self) -> dict[str, Any]:
        req, pos = self.floors()
        return {
            "label": self.label, "verdict": self.verdict, "requests": self.requests,
            "positions": self.positions, "concurrency": self.concurrency,
            "divergences": len(self.divergences), "near_ties": len(self.divergences)
            - len(self.bugs), "bugs": len(self.bugs),
            "reference_disagreements": self.reference_disagreements,
            "floor_request_share_99": req, "floor_position_rate_99": pos,
            "spec_types": self.spec_types, "accepted_share": self.accepted_share,
            "minutes": self.minutes, **self.null,
        }  # fmt: skip

    def text(self) -> str:
        req, pos = self.floors()
        nt = len(self.divergences) - len(self.bugs)
        depths = ", ".join(f"{k}: {v:,}" for k, v in sorted(self.drafted_by_step.items()))
        lines = [
            f"greedy audit{' ' + self.label if self.label else ''}: {self.positions:,} positions "
            f"in {self.requests:,} requests at concurrency {self.concurrency}, T = 0 "
            f"({self.minutes:.1f} min); speculation: {self.spec_types or 'not reported'}",
            f"steps by drafted tokens: {depths or 'none seen'}",
            self._null_line(),
            f"divergences: {len(self.divergences)} ({nt} near-ties, {len(self.bugs)} confident); "
            f"reference decode/law disagreements: {self.reference_disagreements}",
        ]
        for d in self.bugs[:5]:
            lines.append(
                f"  BUG job {d.job} (context {d.context}) position {d.position} ({d.role}, "
                f"token {d.step_index + 1} of a step drafting {d.step_drafted}): expected "
                f"{d.expected}, emitted {d.emitted}; reference margin {d.ref_margin:.3g}, "
                f"audited margin {d.audited_margin:.3g} (its argmax {d.audited_argmax})"
            )
        at = f" or at >= {pos:.3g} of positions" if math.isfinite(pos) else ""
        lines.append(
            f"verdict: {self.verdict}; would catch, with 99% power, a confident wrong token in "
            f">= {req:.2%} of requests{at}"
        )
        return "\n".join(lines)

    def _null_line(self) -> str:
        """The numerics null, or the threshold given when none was measured (no NaN)."""
        tau = self.null.get("tau", math.nan)
        if not self.null.get("null_positions"):
            return f"numerics null: not measured; near-tie threshold tau {tau:.3g} nats (given)"
        return (
            f"numerics null: {self.null['null_positions']} positions, largest path difference "
            f"{self.null.get('null_delta_max', math.nan):.3g} nats -> near-tie threshold tau "
            f"{tau:.3g} nats"
        )


def step_places(plain: list[bool], draft_n: list[int]) -> list[tuple[int, int]]:
    """(index in its verification step, drafts of that step) per token; (-1, 0) when plain.

    Tokens of one step share the server's running ``draft_n``; a new value starts a step that
    drafted the difference (the first step's difference is from 0)."""
    out: list[tuple[int, int]] = []
    prev: int | None = None
    before = 0
    idx = 0
    for p, d in zip(plain, draft_n, strict=True):
        if p:
            out.append((-1, 0))
            if prev is not None:
                before = prev
            prev = None
            continue
        if prev is None or d != prev:
            if prev is not None:
                before = prev
            idx = 0
            prev = d
        else:
            idx += 1
        out.append((idx, d - before))
    return out


async def measure_null(client, ref: str, prompts: list[list[int]], n_positions: int,
                       banned: tuple[int, ...], n_predict: int) -> Null:  # fmt: skip  # noqa: ANN001
    """Margins at ``n_positions`` positions of the reference's own greedy outputs, read by
    its decode path (slot 0, cached prefix) and its batch path (slot 1, no cache)."""
    deltas, margins = [], []
    per = max(1, math.ceil(n_positions / len(prompts)))
    for ctx in prompts:
        out = await greedy_tokens(client, ref, ctx, min(n_predict, per), banned, 0)
        for t in range(len(out)):
            if len(deltas) >= n_positions:
                break
            a = await margin_at(client, ref, ctx + out[:t], banned, 0, cache=True)
            b = await margin_at(client, ref, ctx + out[:t], banned, 1, cache=False)
            same = a.argmax == b.argmax
            deltas.append(abs(a.margin - b.margin) if same else a.margin + b.margin)
            margins.append(a.margin)
        if len(deltas) >= n_positions:
            break
    d = np.array(deltas, dtype=np.float64)
    return Null(len(d), d, np.array(margins, dtype=np.float64), tau_from(d))


def verdict_of(divergences: list[Divergence]) -> str:
    if any(d.klass == BUG for d in divergences):
        return "BUG"
    return "near-ties only (numerics)" if divergences else "identical"


async def check_generation(client, ref: str, server: str, g: Generation, ctx: list[int],
                           context: int, banned: tuple[int, ...], slot: int | None,
                           tau: float) -> tuple[list[Divergence], int]:  # fmt: skip  # noqa: ANN001
    """Every token of ``g`` against the reference's argmax at its prefix: the divergences, and
    how many positions the reference's decode and law disagreed on."""
    from specsim.serve.audit.stats import ROLES

    toks = g.tokens
    places = step_places(g.plain, g.draft_n) if g.draft_n else [(-1, 0)] * len(toks)
    out: list[Divergence] = []
    disagree = 0
    pos = 0
    while pos < len(toks):
        want = await greedy_tokens(client, ref, ctx + toks[:pos], len(toks) - pos, banned, slot)
        k = next(
            (i for i, (a, b) in enumerate(zip(want, toks[pos:], strict=False)) if a != b), None
        )
        if k is None:
            break
        i = pos + k
        prefix = ctx + toks[:i]
        law = await margin_at(client, ref, prefix, banned, slot)
        if law.argmax == toks[i]:
            disagree += 1  # the reference's decode and its law differ here: not the server's
        else:
            own = await margin_at(client, server, prefix, banned, None, who="the server")
            idx, drafted = places[i]
            out.append(
                Divergence(
                    job=g.job,
                    context=context,
                    position=i,
                    role=ROLES[g.roles[i]] if i < len(g.roles) else ROLES[0],
                    step_index=idx,
                    step_drafted=drafted,
                    expected=law.argmax,
                    emitted=int(toks[i]),
                    ref_margin=law.margin,
                    emitted_gap=law.gap(toks[i]),
                    audited_margin=own.margin,
                    audited_argmax=own.argmax,
                    klass=BUG if law.gap(toks[i]) > tau else NEAR_TIE,
                    prefix=prefix,
                )  # fmt: skip
            )
        pos = i + 1
    return out, disagree


@dataclass(frozen=True)
class GreedySpec:
    """One greedy audit: where, how many requests, how many in flight."""

    server: str
    reference: str
    prompts: tuple[tuple[int, ...], ...]
    n_predict: int = 64
    requests: int = 64
    minutes: float | None = None
    concurrency: int = 1
    ref_slots: int = 1
    banned: tuple[int, ...] = ()
    seed: int = 0
    label: str = ""
    stop_on_bug: bool = False  # start no request after the first confident divergence
    timeout_s: float = 600.0  # one generation, and one read within any request

    def __post_init__(self) -> None:
        if self.n_predict < 1 or self.requests < 1 or self.concurrency < 1:
            raise SpecsimError("--n-predict, the request budget and --concurrency must be >= 1")
        if not self.prompts:
            raise SpecsimError("the greedy audit needs at least one prompt")


async def run_greedy_async(spec: GreedySpec, null: Null, progress: Any = None,
                           partial: list[GreedyResult] | None = None) -> GreedyResult:  # fmt: skip
    """The greedy audit of ``spec.server``: ``spec.requests`` requests (or until
    ``spec.minutes``), ``spec.concurrency`` in flight, each checked token for token. Cancelled
    (a signal), it appends what it compared so far to ``partial``."""
    import httpx

    t0 = time.monotonic()
    deadline = None if spec.minutes is None else t0 + 60.0 * spec.minutes
    sampling = Sampling(temperature=0.0, banned=spec.banned)
    divs: list[Divergence] = []
    steps: dict[int, int] = {}
    state = {"next": 0, "done": 0, "positions": 0, "disagree": 0, "drafted": 0, "accepted": 0,
             "generated": 0, "spec": ""}  # fmt: skip
    limits = httpx.Limits(max_connections=4 * spec.concurrency + 4)
    timeout = httpx.Timeout(spec.timeout_s, connect=min(30.0, spec.timeout_s))
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as c:

        async def worker(w: int) -> None:
            while state["next"] < spec.requests:
                if deadline is not None and time.monotonic() > deadline:
                    return
                if spec.stop_on_bug and any(d.klass == BUG for d in divs):
                    return
                j = state["next"]
                state["next"] += 1
                ci = j % len(spec.prompts)
                ctx = list(spec.prompts[ci])
                seed = int((spec.seed * 1_000_003 + j * 7_919 + 12_345) % 2_147_483_647)
                try:  # a whole generation is bounded: a server may trickle forever
                    g = await within(
                        generate_llama(c, spec.server, j, ctx, spec.n_predict, sampling, seed),
                        spec.timeout_s,
                    )
                except TimeoutError:
                    raise SpecsimError(
                        f"the server at {spec.server} did not finish a generation within "
                        f"{spec.timeout_s:g} s (--timeout-s)"
                    ) from None
                if g.error:
                    raise SpecsimError(f"the server at {spec.server} answered {g.error}")
                slot = w % spec.ref_slots
                found, dis = await check_generation(c, spec.reference, spec.server, g, ctx, ci,
                                                    spec.banned, slot, null.tau)  # fmt: skip
                for d in found:
                    d.found_minutes = (time.monotonic() - t0) / 60.0
                divs.extend(found)
                for idx, d in step_places(g.plain, g.draft_n) if g.draft_n else []:
                    if idx == 0:
                        steps[d] = steps.get(d, 0) + 1
                state["done"] += 1
                state["positions"] += len(g.tokens)
                state["disagree"] += dis
                state["generated"] += len(g.tokens)
                if g.drafted is not None:
                    state["drafted"] += g.drafted
                    state["accepted"] += g.accepted or 0
                state["spec"] = g.spec_types or state["spec"]
                if progress is not None:
                    progress(state, divs)

        def finish() -> GreedyResult:
            divs.sort(key=lambda d: (d.job, d.position))
            gen = state["generated"]
            share = state["accepted"] / gen if gen and state["drafted"] else math.nan
            return GreedyResult(
                label=spec.label, verdict=verdict_of(divs), requests=state["done"],
                positions=state["positions"], concurrency=spec.concurrency, divergences=divs,
                reference_disagreements=state["disagree"], null=null.summary(),
                minutes=(time.monotonic() - t0) / 60.0, spec_types=state["spec"],
                accepted_share=share, drafted_by_step=steps,
            )  # fmt: skip

        try:
            await gather_all([worker(w) for w in range(spec.concurrency)])
        except httpx.HTTPError as exc:
            raise SpecsimError(
                f"a server stopped answering during the greedy audit ({_why(exc)})"
            ) from None
        except asyncio.CancelledError:  # a signal stopped the run: keep what it compared
            if partial is not None:
                partial.append(finish())
            raise
    return finish()


async def prepare(
    cfg: Any, ref: str, null: Null | None = None
) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...], Null, int]:
    """Prompts (token ids), banned tokens, the numerics null and the reference's slots."""
    import httpx

    from specsim.serve.audit.client import banned_tokens, chat_prompt, slots, tokenize
    from specsim.serve.audit.config import contexts_of

    async with httpx.AsyncClient(
        timeout=httpx.Timeout(cfg.timeout_s, connect=min(30.0, cfg.timeout_s))
    ) as c:
        try:
            msgs = contexts_of(cfg)
            prompts = tuple(
                [tuple(await tokenize(c, ref, await chat_prompt(c, ref, m))) for m in msgs]
            )
            n_slots = await slots(c, ref)
            banned = await banned_tokens(c, cfg, ref)
        except httpx.HTTPError as exc:
            raise SpecsimError(f"the reference at {ref} does not answer ({_why(exc)})") from None
        if null is not None:
            pass  # measured before, on the same model and reference flags
        elif cfg.near_tie is not None:
            null = Null(0, np.zeros(0), np.zeros(0), float(cfg.near_tie))
        elif n_slots < 2:
            raise SpecsimError(
                f"the reference at {ref} has 1 slot; the greedy audit's null reads two paths: "
                "start it with -np 2 (or more), or give --near-tie NATS"
            )
        else:
            try:
                null = await measure_null(c, ref, [list(p) for p in prompts],
                                          cfg.null_positions, banned, cfg.n_predict)  # fmt: skip
            except httpx.HTTPError as exc:
                raise SpecsimError(
                    f"the reference at {ref} failed while measuring the numerics null ({_why(exc)})"
                ) from None
    return prompts, banned, null, n_slots


def run_greedy(cfg: Any, progress: Any = None) -> GreedyResult:
    """``check-lossless --server URL --temperature 0``: the greedy audit of ``cfg.server``
    (``cfg.tokens // cfg.n_predict`` requests, or until ``cfg.minutes``)."""
    from specsim.serve.audit.reference import check_answering, reference_url

    if cfg.server is None:
        raise SpecsimError("--server URL is required for a server audit")
    if cfg.api != "llama":
        raise SpecsimError("the greedy audit reads speculative steps: use --api llama")
    check_answering(cfg)  # a server that never answers: bounded and named, before the run
    with reference_url(cfg) as ref:
        got: list[Any] = []

        async def setup() -> None:
            got.append(await prepare(cfg, ref))

        stopped = run_stoppable(setup())
        if stopped is not None:
            raise AuditInterrupted(stopped)
        prompts, banned, null, n_slots = got[0]
        spec = GreedySpec(
            server=cfg.server, reference=ref, prompts=prompts, n_predict=cfg.n_predict,
            requests=max(1, cfg.tokens // cfg.n_predict), minutes=cfg.minutes,
            concurrency=cfg.concurrency, ref_slots=n_slots, banned=banned, seed=cfg.seed,
            label=cfg.label, timeout_s=cfg.timeout_s,
        )  # fmt: skip
        partial: list[GreedyResult] = []
        done: list[GreedyResult] = []

        async def audit() -> None:
            done.append(await run_greedy_async(spec, null, progress, partial))

        stopped = run_stoppable(audit())
        if stopped is not None:
            raise AuditInterrupted(stopped, partial[0] if partial else None)
        return done[0]


def _why(exc: Exception) -> str:
    """An httpx error in a few words (a timeout's own message is often empty)."""
    text = str(exc)[:200]
    if "Timeout" in type(exc).__name__:
        return f"{type(exc).__name__}: no answer within --timeout-s {text}".strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
