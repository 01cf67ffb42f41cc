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
  (``static:k``) and on (``vllm-adaptive`` on the block's first k drafts). Default: k = the
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
from dataclasses import asdict, dataclass, field
from typing import Any

from specsim.analysis.tune.grid import (
    Candidate,
    candidates,
    dropped_lens,
    schedule_candidate,
    tuned_schedule,
)
from specsim.analysis.tune.score import (
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
from specsim.errors import SpecsimError
from specsim.options import option as _f

ENGINES = ("vllm", "trtllm", "sglang", "llama")
OBJECTIVES = ("throughput", "goodput", "tpot", "ttft")
QUANTILES = (50, 90, 95, 99)
DEFAULT_GAINS = (0.0, 0.02, 0.04, 0.08)
DEFAULT_P_MINS = (0.0, 0.1, 0.2, 0.3, 0.5, 0.7)
# Requests per replay when --requests is not given. A replay costs about one policy call per
# engine step, and a closed loop at C takes requests x output / (C x tau) steps: a multiple of
# C keeps that flat across loads; the floor keeps a P90 over at least 100 requests at low
# concurrency. 8C, not the 3C replay accepts: warm-up and drain take C each, so the steady
# window holds ~6C. At 4C (a 2C window) the paired intervals at C = 64 on synthetic-chat were
# +-5-10% and SGLang's recommendation moved with --seed; at 8C they are +-2-4% and it held.
MIN_REQUESTS, REQUESTS_PER_CONCURRENCY, OPEN_LOOP_REQUESTS = 100, 8, 200
# Seeds per setting: 5 gives a paired t-interval (4 degrees of freedom) that separates the
# settings a seed change reorders from those it does not, at 5x one replay's cost.
DEFAULT_SEEDS, MAX_SEEDS = 5, 100


@dataclass(frozen=True)
class TuneConfig:
    """What ``tune`` searches and how it scores; also the ``config`` of ``--json``."""

    engine: str = _f("vllm", "the engine whose knobs are searched", choices=ENGINES)
    # -- the load: one of these (tuples: one search per load)
    concurrency: tuple[int, ...] | None = _f(None, "closed-loop loads", cli=False)
    rate: tuple[float, ...] | None = _f(None, "open-loop loads, requests/s", cli=False)
    arrivals: str | None = _f(None, "arrival times from a CSV or azure-conv/azure-code", cli=False)
    cv: float | None = _f(None, "with rate: Gamma gaps of this CV", cli=False)
    requests: int | None = _f(
        None,
        f"requests per replay (default: closed loop max({MIN_REQUESTS}, "
        f"{REQUESTS_PER_CONCURRENCY}C), open loop {OPEN_LOOP_REQUESTS})",
        type=int,
    )
    profile: str = _f("h100-dense-8b", "cost profile", cli=False)
    seed: int = _f(0, "random seed, the same for every candidate", cli=False)
    seeds: int = _f(
        DEFAULT_SEEDS,
        "replays per setting, seeds --seed x N .. --seed x N + N-1, the same for every setting "
        "(common random numbers): each number is their mean, each setting's difference to the "
        "best gets a 95% interval, and settings within noise of the best tie",
        type=int,
    )
    # -- the SLA and the objective
    slo: str | None = _f(
        None, "SLA latencies in ms, e.g. ttft=200,tpot=50 (e2e= too): each one's "
        "--sla-quantile percentile must be at most its bound", metavar="ttft=MS,tpot=MS",
    )  # fmt: skip
    sla_tps: float | None = _f(None, "SLA: mean per-user speed at least this, tok/s", type=float)
    sla_quantile: int = _f(90, "the percentile the --slo bounds hold at", choices=QUANTILES)
    objective: str | None = _f(
        None,
        "what the best setting maximises among those meeting the SLA: throughput (tok/s), "
        "goodput (req/s meeting --slo), tpot or ttft (lowest percentile); default: throughput "
        "for --concurrency, tpot for --rate/--arrivals",
        choices=OBJECTIVES,
    )
    # -- the grid
    draft_lens: tuple[int, ...] | None = _f(
        None, "draft lengths tried (k, max_draft_len, G, N; default: 1..the block)",
        type=int, sequence=True,
    )  # fmt: skip
    gains: tuple[float, ...] = _f(DEFAULT_GAINS, "trtllm: confidence_min_predicted_gain grid")
    p_mins: tuple[float, ...] = _f(DEFAULT_P_MINS, "llama: --spec-draft-p-min grid")
    # -- what the printed config names
    drafter: str | None = _f(
        None, "the drafter path the printed config names (default: a placeholder per engine)"
    )
    workers: int = _f(1, "local processes replaying candidates (1: this process)")

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise SpecsimError(
                f"unknown engine {self.engine!r}; choose one of {', '.join(ENGINES)}"
            )
        loads = [n for n in ("concurrency", "rate", "arrivals") if getattr(self, n) is not None]
        if len(loads) != 1:
            raise SpecsimError(
                "give one load: --concurrency C[,C...], --rate R[,R...] or --arrivals CSV"
                + (f", not {' and '.join(loads)}" if loads else "")
            )
        if self.objective is not None and self.objective not in OBJECTIVES:
            raise SpecsimError(f"--objective must be one of {', '.join(OBJECTIVES)}")
        if self.objective == "goodput" and not self.slo:
            raise SpecsimError("--objective goodput counts requests meeting --slo: give --slo")
        if self.sla_quantile not in QUANTILES:
            raise SpecsimError(f"--sla-quantile must be one of {QUANTILES}")
        if self.draft_lens is not None and (not self.draft_lens or min(self.draft_lens) < 1):
            raise SpecsimError("--draft-lens takes draft lengths of at least 1, e.g. 1,2,4,7")
        if any(not (math.isfinite(g) and g >= 0) for g in self.gains):
            raise SpecsimError("--gains takes numbers >= 0, e.g. 0,0.02,0.04,0.08")
        if any(not (0.0 <= p <= 1.0) for p in self.p_mins):
            raise SpecsimError("--p-mins takes confidences in [0, 1], e.g. 0,0.1,0.3,0.5")
        if isinstance(self.workers, bool) or int(self.workers) != self.workers or self.workers < 1:
            raise SpecsimError(f"--workers must be a whole number >= 1, got {self.workers}")
        n = self.seeds
        if isinstance(n, bool) or int(n) != n or not 1 <= n <= MAX_SEEDS:
            raise SpecsimError(f"--seeds must be a whole number in [1, {MAX_SEEDS}], got {n}")
        s = self.seed
        if isinstance(s, bool) or not hasattr(s, "__index__") or not 0 <= int(s) < 2**63:
            raise SpecsimError(f"--seed must be a whole number in [0, 2^63), got {s!r}")
        s = int(s)
        if s * n + n > 2**63:
            raise SpecsimError(
                f"--seed {s} with --seeds {n} replays seeds up to {s * n + n - 1}, past 2^63: "
                "use a smaller --seed"
            )

    @property
    def seed_list(self) -> tuple[int, ...]:
        """The seeds every setting is replayed with: ``seed x seeds`` + 0 .. seeds-1, so two
        ``--seed`` values share no seed and ``--seeds 1`` is ``--seed`` itself."""
        return tuple(int(self.seed) * int(self.seeds) + i for i in range(int(self.seeds)))

    @property
    def load_kind(self) -> str:
        return next(n for n in ("concurrency", "rate", "arrivals") if getattr(self, n) is not None)

    @property
    def loads(self) -> tuple[Any, ...]:
        """The loads searched, one search each."""
        v = getattr(self, self.load_kind)
        return (v,) if isinstance(v, str) else tuple(v)

    @property
    def closed(self) -> bool:
        return self.load_kind == "concurrency"

    def objective_name(self) -> str:
        return self.objective or ("throughput" if self.closed else "tpot")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


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


def tune(trace: Any, cfg: TuneConfig, progress: Any = None) -> TuneResult:
    """Search ``cfg.engine``'s knobs at every load of ``cfg`` on ``trace`` (a Trace, a path or
    a shipped trace's name); see the module docstring for the grid and the scoring."""
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
    cands = candidates(cfg, block)
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
        results.append(_score(scored, cands, load, obj, q, cfg.engine, tuple(warns)))
    extra: dict[str, Any] = {}
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
        acceptance=acceptance_check(tr, str(profile.name)),
        notes=notes,
    )


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
