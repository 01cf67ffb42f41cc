"""Audit a running server: does speculation change the law of what it says?

``run_audit(cfg)`` sends requests to the audited server (speculation on), scores every emitted
token on a reference server (the same model, speculation off: the law the audited server must
keep), and runs the sequential checks of :mod:`specsim.serve.audit.stats` at 1,024 x 2^j
positions until one rejects (LOSSY) or the budget (tokens, minutes) is spent (no evidence of
loss, with the floor: the TV the run would have caught with 99% power). Positions are counted
in job order (job j: context j mod the number of contexts, seed derived from the run's), so a
run gives the same verdict at any concurrency and a resumed run (``state``) continues exactly
where the saved one stopped.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specsim.errors import SpecsimError
from specsim.serve.audit import stats as st
from specsim.serve.audit.client import (
    Generation,
    Sampling,
    Scored,
    banned_tokens,
    chat_prompt,
    generate_completions,
    generate_llama,
    score,
    slots,
    tokenize,
    within,
)
from specsim.serve.audit.config import (
    MAX_REFERENCE_CONCURRENCY,
    STATE_VERSION,
    AuditConfig,
    config_dict,
    contexts_of,
    load_state,
    save_state,
)
from specsim.serve.audit.pipeline import Busy, Stages, run_pipeline
from specsim.serve.audit.reference import check_answering, reference_url
from specsim.serve.stoppable import AuditInterrupted, run_stoppable


@dataclass
class AuditResult:
    """The verdict of one audit and everything it rests on (one row of reports' audit.csv)."""

    label: str
    verdict: str  # "no evidence of loss" | "LOSSY" | "too few positions"
    positions: int
    generations: int
    contexts: int
    sampling: str
    spec_types: str
    accepted_share: float  # share of emitted tokens that were accepted drafts (nan: unknown)
    roles: dict[str, int]  # positions per place in a speculative step
    looks: int
    rank_p: float
    pit_p: float
    top1_p: float
    alpha_look: float
    tv_floor_99: float
    pit_floor_99: float
    top1_floor_99: float  # smallest top-1 shift per position caught in the largest stratum
    top1_floor_stratum: str
    evidence: str
    minutes: float
    outside_support: int
    outside_examples: list[dict[str, Any]] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    scored: int = 0  # positions scored in all (the looks read the first ``positions``)
    busy: Busy | None = None  # where this sitting's time went (None: no request was made)

    @property
    def per_minute(self) -> float:
        """Positions scored a minute: the rate that decides which shifts a budget can catch."""
        return self.scored / self.minutes if self.minutes > 0 else float("nan")

    @property
    def lossy(self) -> bool:
        return self.verdict == "LOSSY"

    def row(self) -> dict[str, Any]:
        keys = (
            "label", "verdict", "positions", "generations", "contexts", "sampling", "spec_types",
            "accepted_share", "looks", "rank_p", "pit_p", "top1_p", "alpha_look", "tv_floor_99",
            "pit_floor_99", "top1_floor_99", "top1_floor_stratum", "outside_support", "minutes",
            "evidence", "scored", "per_minute",
        )  # fmt: skip
        out = {k: getattr(self, k) for k in keys}
        g, s = self.busy.shares() if self.busy else (float("nan"), float("nan"))
        out.update(generate_busy=g, score_busy=s,
                   scorers=self.busy.n_score if self.busy else 0)  # fmt: skip
        return out

    def text(self) -> str:
        share = "unknown" if not np.isfinite(self.accepted_share) else f"{self.accepted_share:.1%}"
        roles = ", ".join(f"{k} {v:,}" for k, v in self.roles.items() if v)
        lines = [
            f"server audit{' ' + self.label if self.label else ''}: {self.positions:,} positions "
            f"tested in {self.generations:,} generations after {self.contexts} contexts "
            f"({self.minutes:.1f} min)",
            f"sampling: {self.sampling}; speculation: {self.spec_types or 'not reported'}; "
            f"emitted tokens that were accepted drafts: {share}; positions by place in a "
            f"speculative step: {roles or 'unknown'}",
        ]
        if self.busy is not None:
            lines.append(f"rate: {self.scored:,} positions scored, {self.per_minute:,.0f} a "
                         f"minute; {self.busy.text()}")  # fmt: skip
        if self.verdict == "too few positions":  # no look: no p-value, no floor to print
            lines.append("verdict: too few positions for a first look (1,024); raise the budget")
            return "\n".join(lines)
        lines += [
            f"checks (looks: {self.looks}, alpha per look {self.alpha_look:.2g}, family-wise "
            f"<= 1e-6): rank cells p={self.rank_p:.3g}, PIT p={self.pit_p:.3g}, top-1 "
            f"p={self.top1_p:.3g}; tokens the "
            f"reference gives probability 0: {self.outside_support}",
        ]
        if self.lossy:
            lines.append(f"verdict: LOSSY: {self.evidence}")
        else:
            lines.append(
                f"verdict: no evidence of loss; floor TV {self.tv_floor_99:.2g} (a shift of "
                f"the rank-cell law of that TV in every stratum is caught with 99% power at "
                f"these {self.positions:,} positions; PIT floor {self.pit_floor_99:.2g}; top-1 "
                f"floor {self.top1_floor_99:.2g} a position in {self.top1_floor_stratum}: a "
                f"swap to the second token at rate {self.top1_floor_99:.2g} / p1 there)"
            )
        return "\n".join(lines)


MAX_EXAMPLES = 20


def _request_seed(seed: int, job: int) -> int:
    return int((seed * 1_000_003 + job * 7_919 + 12_345) % 2_147_483_647)


class _Run:
    """The mutable side of one audit: counts in job order, looks, the stop flag."""

    def __init__(self, cfg: AuditConfig, saved: dict[str, Any] | None) -> None:
        self.cfg = cfg
        s = saved or {}
        self.counts = st.Counts.from_json(s["counts"]) if saved else st.Counts()
        self.jobs_done = int(s.get("jobs_done", 0))
        self.history: list[dict[str, Any]] = list(s.get("history", []))
        self.minutes_before = float(s.get("minutes", 0.0))
        self.drafted = int(s.get("drafted", 0))
        self.accepted = int(s.get("accepted", 0))
        self.generated = int(s.get("generated", 0))
        self.spec_known = bool(s.get("spec_known", False))
        self.spec_types = str(s.get("spec_types", ""))
        self.roles = np.asarray(s.get("roles", [0] * len(st.ROLES)), dtype=np.int64)
        self.lossy: st.Look | None = None
        # the first tokens the reference gives probability 0: what a bug report needs
        self.outside: list[dict[str, Any]] = list(s.get("outside", []))
        self.evidence = str(s.get("evidence", ""))
        if s.get("verdict") == "LOSSY":
            raise SpecsimError(
                f"--state {cfg.state} already holds a LOSSY verdict ({self.evidence}); "
                "start a new state file to audit again"
            )
        self.pending: dict[int, tuple[Generation, list[Scored]]] = {}
        self.t0 = time.monotonic()
        self.busy: Busy | None = None  # set when the pipeline starts

    @property
    def stop(self) -> bool:
        return self.lossy is not None

    def minutes(self) -> float:
        return self.minutes_before + (time.monotonic() - self.t0) / 60.0

    def absorb(self, job: int, gen: Generation, scored: list[Scored]) -> None:
        """Queue a finished job; count every job that is next in order."""
        self.pending[job] = (gen, scored)
        while self.jobs_done in self.pending and not self.stop:
            g, sc = self.pending.pop(self.jobs_done)
            self._count(g, sc)
            self.jobs_done += 1

    def _count(self, g: Generation, scored: list[Scored]) -> None:
        v = np.random.default_rng([self.cfg.seed, g.job, 7]).random(len(g.tokens))
        for t, (tok, sc) in enumerate(zip(g.tokens, scored, strict=True)):
            hit = np.flatnonzero(sc.ids == tok)
            rank = int(hit[0]) if hit.size else None
            outside = rank is None and sc.complete
            role = g.roles[t] if t < len(g.roles) else 0
            if outside and len(self.outside) < MAX_EXAMPLES:
                self.outside.append(
                    {"job": g.job, "position": t, "role": st.ROLES[role], "token": int(tok),
                     "reference_ids": sc.ids.tolist(), "reference_probs": sc.probs.tolist()}
                )  # fmt: skip
            law = st.cell_law(sc.probs, sc.complete)
            top1 = float(sc.probs[0]) if sc.probs.size else 0.0
            u = st.pit(sc.probs, rank, sc.complete, float(v[t]))
            self.counts.add(st.stratum_of(top1, role), st.cell_of(rank), law, u, outside)
            self.roles[role] += 1
            if st.is_look(self.counts.positions):
                self._look()
                if self.stop:
                    return
        self.generated += len(g.tokens)
        if g.drafted is not None:
            self.spec_known = True
            self.drafted += g.drafted
            self.accepted += g.accepted or 0
        if g.spec_types:
            self.spec_types = g.spec_types

    def _look(self) -> None:
        lk = st.look(self.counts, alpha_run=self.cfg.alpha_run)
        self.history.append(
            {
                "n": lk.n,
                "k": lk.k,
                "alpha": lk.alpha,
                "rank_p": lk.rank.p_value,
                "pit_p": lk.pit.p_value,
                "top1_p": lk.top1.p_value if lk.top1 is not None else float("nan"),
                "rank_floor": lk.rank_floor,
                "pit_floor": lk.pit_floor,
                "rank_df": lk.rank.df,
                "minutes": self.minutes(),
            }  # fmt: skip
        )
        self.last = lk
        if lk.rejected:
            self.lossy = lk
            if lk.rejected == "top1":
                t = lk.top1
                self.evidence = (
                    f"top1 check at look {lk.k} ({lk.n:,} positions, {self.minutes():.1f} min): "
                    f"p={t.p_value:.3g} <= alpha {lk.alpha:.2g}; {st.stratum_name(t.stratum)}: "
                    f"top-1 count {t.deficit:+.1f} against its expectation (variance "
                    f"{t.variance:.1f})"
                )
                return
            g = lk.rank if lk.rejected == "rank" else lk.pit
            where = st.worst_cell(self.counts) if lk.rejected == "rank" else self._pit_worst()
            self.evidence = (
                f"{lk.rejected} check at look {lk.k} ({lk.n:,} positions, {self.minutes():.1f} "
                f"min): p={g.p_value:.3g} <= alpha {lk.alpha:.2g}, observed TV {g.observed_tv:.3g}"
                f"; {where}"
            )

    def _pit_worst(self) -> str:
        b = self.counts.pit_bins
        e = b.sum() / st.PIT_BINS
        i = int(np.argmax(np.abs(b - e)))
        lo, hi = i / st.PIT_BINS, (i + 1) / st.PIT_BINS
        return f"PIT bin [{lo:.2f}, {hi:.2f}): {int(b[i])} vs {e:.1f}"

    def state(self, verdict: str) -> dict[str, Any]:
        return {
            "version": STATE_VERSION, "fingerprint": self.cfg.fingerprint(),
            "config": config_dict(self.cfg), "counts": self.counts.to_json(),
            "jobs_done": self.jobs_done, "history": self.history, "minutes": self.minutes(),
            "drafted": self.drafted, "accepted": self.accepted, "generated": self.generated,
            "spec_known": self.spec_known, "spec_types": self.spec_types,
            "roles": self.roles.tolist(), "verdict": verdict, "evidence": self.evidence,
            "outside": self.outside,
        }  # fmt: skip


def _sampling(cfg: AuditConfig, banned: tuple[int, ...] = ()) -> Sampling:
    return Sampling(cfg.temperature, cfg.top_k, cfg.top_p, cfg.min_p, cfg.ignore_eos, banned)


def _why(exc: Exception) -> str:
    """An httpx error in a few words (a timeout's own message is often empty)."""
    text = str(exc)[:200]
    if isinstance(exc, TimeoutError) or "Timeout" in type(exc).__name__:
        return f"{type(exc).__name__}: no answer within --timeout-s {text}".strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def _retried(fn: Any, *args: Any, attempts: int = 3) -> Any:
    """Await ``fn(*args)``, again when the connection dropped before an answer: llama-server may
    close a kept-alive connection after a streamed answer, and the client only learns it on
    reuse. A retry repeats the same seeded request, so it chooses nothing by its outcome."""
    import httpx

    for i in range(attempts):
        try:
            return await fn(*args)
        except (httpx.RemoteProtocolError, httpx.ConnectError):
            if i == attempts - 1:
                raise
    return None


async def _audit(cfg: AuditConfig, ref: str, run: _Run, progress: Any) -> None:
    import httpx

    gen = generate_llama if cfg.api == "llama" else generate_completions
    deadline = None if cfg.minutes is None else time.monotonic() + 60.0 * cfg.minutes
    timeout = httpx.Timeout(cfg.timeout_s, connect=min(30.0, cfg.timeout_s))
    limits = httpx.Limits(max_connections=4 * (cfg.concurrency + MAX_REFERENCE_CONCURRENCY) + 4)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as c:
        try:
            msgs = contexts_of(cfg)
            prompts = [await tokenize(c, ref, await chat_prompt(c, ref, m)) for m in msgs]
            n_slots = await slots(c, ref)
            banned = await banned_tokens(c, cfg, ref)
        except httpx.HTTPError as exc:
            raise SpecsimError(f"the reference at {ref} does not answer ({_why(exc)})") from None
        sampling = _sampling(cfg, banned)
        run.sampling = sampling.describe()
        run.n_contexts = len(prompts)
        nxt = run.jobs_done

        def claim() -> int | None:
            # a generation may come back short (llama-server drops a last token that is an
            # incomplete UTF-8 piece): start jobs until the counted positions, plus n_predict
            # per job in flight (generating, queued or scoring), reach the budget
            nonlocal nxt
            if run.counts.positions + (nxt - run.jobs_done) * cfg.n_predict >= cfg.tokens:
                return None
            if deadline is not None and time.monotonic() > deadline:
                return None
            nxt += 1
            return nxt - 1

        async def generate(_w: int, j: int) -> Generation:
            try:  # a whole generation is bounded too: a server may trickle forever
                g = await within(
                    _retried(gen, c, cfg.server, j, prompts[j % len(prompts)], cfg.n_predict,
                             sampling, _request_seed(cfg.seed, j)),
                    cfg.timeout_s,
                )  # fmt: skip
            except TimeoutError:
                raise SpecsimError(
                    f"the server at {cfg.server} did not finish a generation within "
                    f"{cfg.timeout_s:g} s (--timeout-s)"
                ) from None
            except httpx.HTTPError as exc:
                raise SpecsimError(f"the server at {cfg.server} failed ({_why(exc)})") from None
            if g.error:
                raise SpecsimError(f"the server at {cfg.server} answered {g.error}")
            return g

        async def score_job(s: int, j: int, g: Generation) -> list[Scored]:
            try:
                return await _retried(score, c, ref, prompts[j % len(prompts)], g.tokens,
                                      sampling, s, cfg.n_probs)  # fmt: skip
            except httpx.HTTPError as exc:
                raise SpecsimError(
                    f"the reference at {ref} failed while scoring ({_why(exc)})"
                ) from None

        def absorb(j: int, g: Generation, sc: list[Scored]) -> None:
            run.absorb(j, g, sc)
            save_state(cfg.state, run.state("running"))
            if progress is not None:
                progress(run)

        run.busy = Busy(n_gen=cfg.concurrency, n_score=scorers(cfg, n_slots))
        stages = Stages(claim, generate, score_job, absorb, lambda: run.stop)
        await run_pipeline(stages, run.busy)


def scorers(cfg: AuditConfig, n_slots: int) -> int:
    """Reference requests in flight: ``--reference-concurrency`` (0: one per reference slot),
    never more than the reference's slots (two requests on one slot would evict each other's
    cached prefix: every position a whole-prefix batch instead of a one-token decode)."""
    want = cfg.reference_concurrency or n_slots
    return max(1, min(want, n_slots, MAX_REFERENCE_CONCURRENCY))


def run_audit(cfg: AuditConfig, progress: Any = None) -> AuditResult:
    """Audit ``cfg.server`` against the reference; resumes from and saves to ``cfg.state``.
    SIGINT or SIGTERM stops it with what it measured (``AuditInterrupted.result``)."""
    if cfg.server is None:
        raise SpecsimError("--server URL is required for a server audit")
    run = _Run(cfg, load_state(cfg.state, cfg))
    run.n_contexts = len(contexts_of(cfg))
    if not run.lossy and run.counts.positions < cfg.tokens:  # a resumed, finished audit asks
        check_answering(cfg)  # nothing; else a server that never answers: bounded and named
    with reference_url(cfg) as ref:
        stopped = run_stoppable(_audit(cfg, ref, run, progress))
    if stopped is not None:
        raise AuditInterrupted(stopped, _result(cfg, run))
    return _result(cfg, run)


def _result(cfg: AuditConfig, run: _Run) -> AuditResult:
    c = run.counts
    n_look = max((p for p in st.look_points(c.positions)), default=0)
    last = run.history[-1] if run.history else None
    if run.lossy:
        verdict = "LOSSY"
    elif last is None:
        verdict = "too few positions"
    else:
        verdict = "no evidence of loss"
    save_state(cfg.state, run.state(verdict))
    share = run.accepted / run.generated if run.spec_known and run.generated else float("nan")
    t1_floor, t1_s = st.top1_floor(c, last["alpha"]) if last else (float("nan"), 0)
    return AuditResult(
        label=cfg.label, verdict=verdict, positions=n_look if not run.lossy else run.lossy.n,
        generations=run.jobs_done, contexts=run.n_contexts,
        sampling=getattr(run, "sampling", _sampling(cfg).describe()),
        spec_types=run.spec_types, accepted_share=share,
        roles=dict(zip(st.ROLES, (int(x) for x in run.roles), strict=True)),
        looks=len(run.history), rank_p=last["rank_p"] if last else float("nan"),
        pit_p=last["pit_p"] if last else float("nan"),
        top1_p=last.get("top1_p", float("nan")) if last else float("nan"),
        alpha_look=last["alpha"] if last else float("nan"),
        tv_floor_99=last["rank_floor"] if last else float("nan"),
        pit_floor_99=last["pit_floor"] if last else float("nan"),
        top1_floor_99=t1_floor, top1_floor_stratum=st.stratum_name(t1_s) if last else "",
        evidence=run.evidence, minutes=run.minutes(), outside_support=c.outside_support,
        outside_examples=run.outside, history=run.history, scored=c.positions,
        busy=run.busy,
    )  # fmt: skip
