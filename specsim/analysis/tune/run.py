"""``tune``: the best setting of one engine's DSpark knobs at a load, under an SLA.

An operator does not deploy a specsim policy; they set their engine's knobs. This module
translates each engine's knobs into the built-in policy that is that engine's rule
(:mod:`specsim.policies.engines`), replays every setting of a small grid at the load over
``seeds`` seeds, the SAME seeds for every setting (common random numbers: every candidate meets
the same arrivals and the same requests, so the differences between rows are the knobs', paired
seed by seed), and picks the best by the objective's mean among the settings that meet the SLA.
Beside the grid it always replays the engine's DEFAULT setting and no speculation (``ar``), so
the table says what tuning buys. Settings whose paired difference to the best is within noise
(its 95% interval holds 0) tie with it, and one of them is RECOMMENDED by a stated rule
(:mod:`specsim.analysis.tune.score`): the answer does not change with ``--seed`` where the
search cannot tell the settings apart.

Knobs, in specsim terms (``k`` ranges over ``draft_lens``, 1..the trace's block by default;
a length past the block is left out, with a note):

- vllm: ``num_speculative_tokens`` k, each with ``enable_adaptive_verification`` off
  (``static:k``) and on (``vllm-adaptive:k``: on the block's first k drafts). Default: k = the
  block (docs/vllm.md serves the drafter so), adaptive off (vLLM's default).
- trtllm: ``max_draft_len`` k with confidence scheduling off (``static:k``) and on at each
  ``confidence_min_predicted_gain`` G of ``gains`` (``trtllm-confidence:G`` on the first k
  drafts, k >= 2); and ``draft_len_schedule`` ladders (``trtllm-schedule``). Default:
  ``max_draft_len`` = the block, ``enable_confidence_scheduling`` off (``DSparkDecodingConfig``'s
  default: the block drafted and verified whole).
- sglang: ``--speculative-dspark-block-size`` G (``--speculative-num-draft-tokens`` G + 1),
  ``sglang-dspark:G``. Default: G = the block (``DEFAULT_DSPARK_GAMMA``, the checkpoint's).
- llama: ``--spec-draft-n-max`` N x ``--spec-draft-p-min`` P (``llama-dspark:P:N``). Default:
  P = 0 (llama.cpp's default) and N = the block (docs/llama-cpp-dspark.md).

A setting of fewer drafts than the block is predicted as the block's first k drafts (the trace
truncated): DSpark's block is non-causal, so a drafter RUN with a shorter block drafts other
tokens; the rendered config says so (:mod:`specsim.analysis.tune.configs`).

Objective (``objective``): ``throughput`` (the steady-state output tokens/s of a closed loop,
the whole-run output tokens/s of an open one, both for the whole deployment: the profile's
GPUs together; higher is better), ``goodput`` (requests/s that meet every ``--slo``), ``tpot``
or ``ttft`` (the SLA quantile of that latency, lower is better). Default: ``throughput`` for a
closed loop; ``tpot`` for an open loop, whose throughput is the arrival rate whatever the knobs
(its differences would be noise). The SLA: every ``--slo`` latency's ``sla_quantile``
percentile (P90 by default), averaged over the seeds, at most its bound, and the mean per-user
speed at least ``--sla-tps`` (the rule of :func:`specsim.analysis.maxload.find_max_load`).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from specsim.analysis.tune.grid import (
    Candidate,
    candidates,
    dropped_lens,
    schedule_candidate,
    tuned_schedule,
)
from specsim.analysis.tune.score import (
    BATCHED_HINT,
    TIE_RULE,
    TIE_SHARE,
    Sla,
    acceptance_check,
    describe_objective,
    explain,
    make_row,
    mark_ties,
    maximize,
    pick_best,
    recommend,
)
from specsim.analysis.tune.tune_config import (  # noqa: F401 - TuneConfig's home; re-exported
    DEFAULT_GAINS,
    DEFAULT_P_MINS,
    DEFAULT_SEEDS,
    ENGINES,
    MAX_SEEDS,
    MIN_REQUESTS,
    OBJECTIVES,
    OPEN_LOOP_REQUESTS,
    QUANTILES,
    REQUESTS_PER_CONCURRENCY,
    TuneConfig,
)
from specsim.errors import SpecsimError


@dataclass(frozen=True)
class Load:
    """One load: ``kind`` concurrency / rate / arrivals and its value."""

    kind: str
    value: Any

    def describe(self) -> str:
        if self.kind == "concurrency":
            return f"{int(self.value)} in flight"
        if self.kind == "rate":
            return f"{self.value:g} req/s"
        return f"arrivals {self.value}"

    def replay_kwargs(self, cfg: TuneConfig) -> dict[str, Any]:
        kw: dict[str, Any] = {self.kind: int(self.value) if self.kind == "concurrency"
                              else self.value}  # fmt: skip
        if self.kind == "rate" and cfg.cv is not None:
            kw["cv"] = cfg.cv
        requests = cfg.requests
        if requests is None and self.kind == "concurrency":
            requests = max(MIN_REQUESTS, REQUESTS_PER_CONCURRENCY * int(self.value))
        elif requests is None:
            requests = OPEN_LOOP_REQUESTS
        kw["requests"] = int(requests)
        return kw


def truncate_block(trace: Any, k: int) -> Any:
    """The trace with each block cut to its first ``k`` drafts (acceptance capped at k): what a
    setting of k speculative tokens verifies, read as a prefix of the recorded block."""
    from dataclasses import replace

    import numpy as np

    if k >= trace.block_size:
        return trace
    cut = lambda a: None if a is None else np.ascontiguousarray(a[:, :k])  # noqa: E731
    return replace(
        trace,
        conf=cut(trace.conf),
        accept_len=np.minimum(trace.accept_len, k).astype(trace.accept_len.dtype),
        draft_tokens=cut(trace.draft_tokens),
        accept_prob=cut(trace.accept_prob),
        meta={**trace.meta, "block_size": str(k)},
    )


def replay_candidate(trace: Any, cand: Candidate, load: Load, cfg: TuneConfig, profile: Any,
                     seed: int | None = None):  # noqa: ANN201  # fmt: skip
    """(summary, warnings) of one candidate at one load and one seed (``cfg.seed`` if None):
    the same seeds for every candidate."""
    from specsim.sim.simulate import replay

    tr = truncate_block(trace, cand.block) if cand.block is not None else trace
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = replay(
            tr,
            cand.policy,
            profile=profile,
            seed=cfg.seed if seed is None else seed,
            slo=cfg.slo,
            sla_tps=cfg.sla_tps,
            require_steady=True,
            record_steps=False,
            record_tokens=False,
            max_batched_tokens=cand.max_batched_tokens,
            **load.replay_kwargs(cfg),
        )
    return res.summary, [str(w.message) for w in caught]


@dataclass(frozen=True, eq=False)
class LoadResult:
    """The rows of one load, which is best (the highest mean) / recommended (by the tie rule) /
    default / no speculation, the verdict, and each row's objective at each seed."""

    load: Load
    rows: list[dict]
    best: int | None
    default: int
    no_spec: int
    verdict: str
    warnings: tuple[str, ...] = ()
    recommended: int | None = None
    samples: list[list[float]] = field(default_factory=list)
    candidates: list[Candidate] | None = None  # this load's, where it adds rows of its own

    @property
    def best_row(self) -> dict | None:
        return None if self.best is None else self.rows[self.best]

    @property
    def recommended_row(self) -> dict | None:
        return None if self.recommended is None else self.rows[self.recommended]

    @property
    def ties(self) -> list[dict]:
        """The best and the settings within noise of it, in table order."""
        return [r for r in self.rows if r["best"] or r["within_noise"]]


@dataclass(frozen=True, eq=False)
class TuneResult:
    """Every load's result, the candidates (rows in their order), and what was scored how."""

    config: TuneConfig
    block: int
    candidates: list[Candidate]
    loads: list[LoadResult]
    sla: Sla
    objective: str
    objective_text: str
    trace: str = ""
    profile: str = ""
    extra: dict = field(default_factory=dict)
    seeds: tuple[int, ...] = ()
    gpus: int = 1
    acceptance: dict = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    tie_rule: str = TIE_RULE

    def frame(self):  # noqa: ANN201 - pandas.DataFrame
        import pandas as pd

        return pd.DataFrame([r for lr in self.loads for r in lr.rows])


def _run_rows(trace: Any, cands: list[Candidate], load: Load, cfg: TuneConfig, profile: Any,
              progress: Any = None) -> tuple[list[list[dict[str, Any]]], list[str]]:  # fmt: skip
    """Every candidate's summaries at one load, one per seed of ``cfg.seed_list`` (in candidate
    then seed order), and their warnings."""
    jobs = [(c, s) for c in cands for s in cfg.seed_list]
    if cfg.workers <= 1 or len(jobs) == 1:
        out = []
        for c, s in jobs:
            out.append(replay_candidate(trace, c, load, cfg, profile, s))
            if progress is not None:
                progress.update(1)
    else:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=min(cfg.workers, len(jobs))) as pool:
            futs = [pool.submit(replay_candidate, trace, c, load, cfg, profile, s)
                    for c, s in jobs]  # fmt: skip
            out = []
            for f in futs:
                out.append(f.result())
                if progress is not None:
                    progress.update(1)
    n = len(cfg.seed_list)
    summaries = [[s for s, _ in out[i : i + n]] for i in range(0, len(out), n)]
    seen: dict[str, None] = {}
    for _, ws in out:
        seen.update(dict.fromkeys(ws))
    return summaries, list(seen)


Grid = Callable[[TuneConfig, int], list[Candidate]]  # (cfg, the trace's block) -> settings


def tune(trace: Any, cfg: TuneConfig, progress: Any = None, grid: Grid | None = None) -> TuneResult:
    """Search ``cfg.engine``'s knobs at every load of ``cfg`` on ``trace`` (a Trace, a path or
    a shipped trace's name); see the module docstring for the grid and the scoring. ``grid``:
    the settings to search instead of the engine's DSpark grid (``(cfg, block) -> candidates``,
    no speculation and one ``default`` among them), for drafters whose engine knobs differ
    (:mod:`specsim.analysis.tune.families`)."""
    from specsim.sim.config import ReplayConfig
    from specsim.sim.cost.profiles import get_profile
    from specsim.trace.io import read_trace
    from specsim.trace.model import Trace

    tr = trace if isinstance(trace, Trace) else read_trace(trace)
    for x in cfg.loads:  # each load as replay takes it: a one-line error before any replay
        ReplayConfig(**{cfg.load_kind: x}, cv=cfg.cv)
    if cfg.requests is not None:
        ReplayConfig(requests=cfg.requests)
    ReplayConfig(seed=cfg.seed_list[-1])
    sla = Sla.from_config(cfg)
    profile = get_profile(cfg.profile)
    block = tr.block_size
    notes = _draft_len_notes(cfg, block)
    cands = (grid or candidates)(cfg, block)
    if cfg.max_batched_tokens is not None:  # every grid setting at every limit asked for
        settings = [c for c in cands if c.role == "grid"]
        cands = [*(c for c in cands if c.role != "grid"),
                 *(c.with_batched_tokens(n) for n in cfg.max_batched_tokens
                   for c in settings)]  # fmt: skip
    obj, q = cfg.objective_name(), cfg.sla_quantile
    gpus = int(getattr(profile, "gpus", 1) or 1)
    if progress is not None and not getattr(progress, "total", 1):
        progress.total = float(len(cands) * len(cfg.loads) * len(cfg.seed_list))
    results = []
    for x in cfg.loads:
        load = Load(cfg.load_kind, int(x) if cfg.closed else x)
        summaries, warns = _run_rows(tr, cands, load, cfg, profile, progress)
        scored = [
            make_row(c, load, s, cfg, sla, gpus) for c, s in zip(cands, summaries, strict=True)
        ]
        lr = _score(scored, cands, load, obj, q, cfg.engine, tuple(warns))
        if lr.best is None and cfg.max_batched_tokens is None and sla.slo_ms:
            lr = _batched_rescue(tr, cands, lr, cfg, profile, sla, gpus, progress)
        results.append(lr)
    extra: dict[str, Any] = {}
    if profile.meta.get("fit_residual"):  # a profile fitted on the operator's own baseline
        from specsim.sim.cost.baseline import lengths_warning

        extra["fit_residual"] = profile.meta["fit_residual"]
        far = lengths_warning(profile, tr)
        if far:
            results = [replace(lr, warnings=(*lr.warnings, far)) for lr in results]
        extra["fitted"] = profile.meta.get("fitted", "")
        extra["baseline_tok_s"] = _baseline(profile.meta.get("baseline_tok_s", ""))
    sched = tuned_schedule(results, obj) if cfg.engine == "trtllm" and cfg.closed else None
    if sched is not None and len(cfg.loads) > 1:
        cand = schedule_candidate(sched, "tuned across these loads")
        cands = [*cands, cand]
        for i, lr in enumerate(results):  # the schedule replayed at every load, as a grid row
            sums = [replay_candidate(tr, cand, lr.load, cfg, profile, s)[0] for s in cfg.seed_list]
            new = make_row(cand, lr.load, sums, cfg, sla, gpus)
            scored = [*zip(lr.rows, lr.samples, strict=True), new]
            results[i] = _score(scored, cands, lr.load, obj, q, cfg.engine, lr.warnings)
        extra["draft_len_schedule"] = [list(p) for p in sched]
    return TuneResult(
        config=cfg,
        block=block,
        candidates=cands,
        loads=results,
        sla=sla,
        objective=obj,
        objective_text=describe_objective(obj, cfg.closed, q),
        trace=str(tr.path or "<in-memory>"),
        profile=str(profile.name),
        extra=extra,
        seeds=cfg.seed_list,
        gpus=gpus,
        acceptance=acceptance_check(tr, profile),
        notes=notes,
    )


def _batched_rescue(tr: Any, cands: list[Candidate], lr: LoadResult, cfg: TuneConfig,
                    profile: Any, sla: Sla, gpus: int, progress: Any) -> LoadResult:  # fmt: skip
    """Nothing met the SLA at the profile's batched-token limit: the least-bad setting and the
    default replayed at the other limits of ``BATCHED_LADDER`` (prompt chunks share the decode
    steps, so the limit decides TPOT at a load), as rows of this load's table."""
    from specsim.analysis.tune.grid import BATCHED_LADDER
    from specsim.analysis.tune.score import least_bad

    own = int(getattr(profile, "max_batched_tokens", 0) or 0)
    picks = dict.fromkeys([least_bad(lr.rows), lr.default])
    extra = [cands[i].with_batched_tokens(n) for i in picks for n in BATCHED_LADDER if n != own]
    if progress is not None and getattr(progress, "total", None):
        progress.total += float(len(extra) * len(cfg.seed_list))
    summaries, warns = _run_rows(tr, extra, lr.load, cfg, profile, progress)
    new = [make_row(c, lr.load, x, cfg, sla, gpus) for c, x in zip(extra, summaries, strict=True)]
    scored = [*zip(lr.rows, lr.samples, strict=True), *new]
    obj = cfg.objective_name()
    out = _score(scored, [*cands, *extra], lr.load, obj, cfg.sla_quantile, cfg.engine,
                 tuple(dict.fromkeys([*lr.warnings, *warns])))  # fmt: skip
    what = "the least-bad setting and the default" if len(picks) > 1 else "the default"
    why = (
        f"nothing met the SLA at the profile's limit of {own:,} tokens a step, so {what} "
        f"were replayed at {BATCHED_LADDER[0]}-{BATCHED_LADDER[-1]:,} tokens a step; "
    )
    verdict = why + out.verdict.replace(BATCHED_HINT, "") + _ttft_cost(out, cfg)
    return replace(out, candidates=[*cands, *extra], verdict=verdict)


def _ttft_cost(lr: LoadResult, cfg: TuneConfig) -> str:
    """A smaller batched-token limit shortens decode steps by making prompts wait: where the
    pick's TTFT grew, say by how much, and how to bound it (the SLA may not)."""
    rec, d = lr.recommended_row, lr.rows[lr.default]
    key = f"ttft_ms_p{cfg.sla_quantile}"
    if rec is None or "tok/step" not in rec["candidate"] or "ttft" in dict(Sla.from_config(cfg)
                                                                          .slo_ms):  # fmt: skip
        return ""
    a, b = rec.get(key, math.nan), d.get(key, math.nan)
    if not (math.isfinite(a) and math.isfinite(b)) or a <= 1.5 * b:
        return ""
    return (
        f" Its P{cfg.sla_quantile} TTFT is {a:,.0f} ms against {b:,.0f} ms at the profile's "
        "limit (prompts wait for room in the steps): bound it with --slo ttft=MS if it matters."
    )


def _baseline(text: str) -> dict[int, float]:
    """A fitted profile's measured no-speculation throughput by concurrency ("C:tok/s;...")."""
    out: dict[int, float] = {}
    for item in filter(None, str(text).split(";")):
        c, _, v = item.partition(":")
        try:
            out[int(c)] = float(v)
        except ValueError:
            continue  # a hand-edited header: no anchor, the rest of tune unchanged
    return out


def _draft_len_notes(cfg: TuneConfig, block: int) -> tuple[str, ...]:
    """A note naming the ``--draft-lens`` past the block (left out); none left: an error."""
    dropped = dropped_lens(block, cfg.draft_lens)
    if not dropped:
        return ()
    shown = ",".join(map(str, dropped))
    why = (
        f"longer than the trace's block of {block} drafts (the drafter proposes {block} a step, "
        "so the trace cannot predict more)"
    )
    if len(dropped) == len(set(map(int, cfg.draft_lens or ()))):
        raise SpecsimError(f"--draft-lens {shown}: every length is {why}; give lengths 1..{block}")
    return (f"--draft-lens {shown} left out: {why}",)


def _score(scored: list[tuple[dict, list[float]]], cands: list[Candidate], load: Load, obj: str,
           q: int, engine: str, warns: tuple[str, ...]) -> LoadResult:  # fmt: skip
    """Mark the best row of one load (the highest mean meeting the SLA), the rows within noise
    of it, the recommended one, and say how it compares with the default."""
    rows = [r for r, _ in scored]
    samples = [list(x) for _, x in scored]
    best = pick_best(rows, obj)
    mark_ties(rows, samples, best)
    d = next(i for i, c in enumerate(cands) if c.role == "default")
    n = next(i for i, c in enumerate(cands) if c.role == "no-spec")
    rec = recommend(rows, cands, best, d)
    for i, r in enumerate(rows):
        r["recommended"] = i == rec
    verdict = explain(rows, best, d, load, obj, q, engine, recommended=rec)
    return LoadResult(load, rows, best, d, n, verdict, warns, rec, samples)


__all__ = [
    "ENGINES",
    "OBJECTIVES",
    "TIE_RULE",
    "TIE_SHARE",
    "Candidate",
    "Load",
    "LoadResult",
    "Sla",
    "TuneConfig",
    "TuneResult",
    "candidates",
    "explain",
    "maximize",
    "pick_best",
    "truncate_block",
    "tune",
    "tuned_schedule",
]
