"""``tune``: the best setting of one engine's DSpark knobs at a load, under an SLA.

An operator does not deploy a specsim policy; they set their engine's knobs. This module
translates each engine's knobs into the built-in policy that is that engine's rule
(:mod:`specsim.policies.engines`), replays every setting of a small grid once at the load with
the same seed (common random numbers: every candidate meets the same arrivals and the same
requests, so differences between rows are the knobs', not the sampling's), and picks the best
by the objective among the settings that meet the SLA. Beside the grid it always replays the
engine's DEFAULT setting and no speculation (``ar``), so the table says what tuning buys.

Knobs, in specsim terms (``k`` ranges over ``draft_lens``, 1..the trace's block by default):

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
tokens; the rendered config says so (:mod:`specsim.analysis.engine_configs`).

Objective (``objective``): ``throughput`` (the steady-state output tokens/s of a closed loop,
the whole-run output tokens/s of an open one; higher is better), ``goodput`` (requests/s that
meet every ``--slo``), ``tpot`` or ``ttft`` (the SLA quantile of that latency, lower is better).
Default: ``throughput`` for a closed loop; ``tpot`` for an open loop, whose throughput is the
arrival rate whatever the knobs (its differences would be noise). The SLA: every ``--slo``
latency's ``sla_quantile`` percentile (P90 by default) at most its bound, and the mean per-user
speed at least ``--sla-tps`` (the rule of :func:`specsim.analysis.maxload.find_max_load`).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

from specsim.analysis.tune_grid import (
    Candidate,
    candidates,
    schedule_candidate,
)
from specsim.analysis.tune_score import (
    Sla,
    _num,
    describe_objective,
    maximize,
    objective_value,
    throughput,
)
from specsim.errors import SpecsimError
from specsim.options import option as _f

ENGINES = ("vllm", "trtllm", "sglang", "llama")
OBJECTIVES = ("throughput", "goodput", "tpot", "ttft")
QUANTILES = (50, 90, 95, 99)
DEFAULT_GAINS = (0.0, 0.02, 0.04, 0.08)
DEFAULT_P_MINS = (0.0, 0.1, 0.2, 0.3, 0.5, 0.7)
# Requests per replay when --requests is not given. A replay costs about one policy call per
# engine step, and a closed loop at C takes requests x output / (C x tau) steps: 4C requests
# keeps that flat across loads (and holds C for a steady window; 3C is the least replay
# accepts); the floor keeps a P90 over at least 100 requests at low concurrency.
MIN_REQUESTS, REQUESTS_PER_CONCURRENCY, OPEN_LOOP_REQUESTS = 100, 4, 200
# Differences smaller than this share of the objective are called a tie in the verdict: one
# seed's replay does not resolve them (the best row is still the argmax).
TIE_SHARE = 0.01


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


def replay_candidate(trace: Any, cand: Candidate, load: Load, cfg: TuneConfig, profile: Any):  # noqa: ANN201
    """(summary, warnings) of one candidate at one load: the same seed for every candidate."""
    from specsim.sim.simulate import replay

    tr = truncate_block(trace, cand.block) if cand.block is not None else trace
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = replay(
            tr,
            cand.policy,
            profile=profile,
            seed=cfg.seed,
            slo=cfg.slo,
            sla_tps=cfg.sla_tps,
            require_steady=True,
            record_steps=False,
            record_tokens=False,
            **load.replay_kwargs(cfg),
        )
    return res.summary, [str(w.message) for w in caught]


def _row(cand: Candidate, load: Load, s: dict[str, Any], cfg: TuneConfig, sla: Sla) -> dict:
    """One table row: the setting, the predicted numbers, the SLA verdict and the score."""
    q, obj = cfg.sla_quantile, cfg.objective_name()
    tau, eff = float(s["tau"]), float(s["verify_efficiency"])
    verified = (tau - 1.0) / eff if s["verified_draft_tokens"] and eff > 0 else 0.0
    misses = sla.misses(s)
    return {
        "load_kind": load.kind,
        "load": load.value,
        "candidate": cand.label,
        "role": cand.role,
        "policy": cand.policy,
        "block": cand.block,
        "knobs": cand.knob_text(),
        "throughput_tok_s": throughput(s, cfg.closed),
        "tpot_ms_p50": float(s["tpot_ms_p50"]),
        f"tpot_ms_p{q}": float(s[f"tpot_ms_p{q}"]),
        "ttft_ms_p90": float(s["ttft_ms_p90"]),
        f"ttft_ms_p{q}": float(s[f"ttft_ms_p{q}"]),
        "per_user_tps_mean": float(s["per_user_tps_mean"]),
        "goodput_req_s": s.get("goodput_req_s"),
        "tau": tau,
        "verified_per_step": verified,
        "step_ms": 1000.0 * float(s["sim_time_s"]) / max(int(s["engine_steps"]), 1),
        "sla_met": not misses,
        "sla_misses": "; ".join(misses),
        "objective": objective_value(s, obj, cfg.closed, q),
        "best": False,
    }


def pick_best(rows: list[dict], objective: str) -> int | None:
    """The index of the best row meeting the SLA (the first on a tie: no speculation, then the
    default, come first, so a grid setting must beat them strictly); None if none meets it."""
    sign = 1.0 if maximize(objective) else -1.0
    best, best_v = None, -math.inf
    for i, r in enumerate(rows):
        v = r["objective"]
        if not r["sla_met"] or v is None or not math.isfinite(v):
            continue
        if sign * v > best_v:
            best, best_v = i, sign * v
    return best


@dataclass(frozen=True, eq=False)
class LoadResult:
    """The rows of one load, which is best / default / no speculation, and the verdict."""

    load: Load
    rows: list[dict]
    best: int | None
    default: int
    no_spec: int
    verdict: str
    warnings: tuple[str, ...] = ()

    @property
    def best_row(self) -> dict | None:
        return None if self.best is None else self.rows[self.best]


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

    def frame(self):  # noqa: ANN201 - pandas.DataFrame
        import pandas as pd

        return pd.DataFrame([r for lr in self.loads for r in lr.rows])


def _run_rows(trace: Any, cands: list[Candidate], load: Load, cfg: TuneConfig, profile: Any,
              progress: Any = None) -> tuple[list[dict[str, Any]], list[str]]:  # fmt: skip
    """Every candidate's summary at one load (in candidate order), and their warnings."""
    if cfg.workers <= 1 or len(cands) == 1:
        out = []
        for c in cands:
            out.append(replay_candidate(trace, c, load, cfg, profile))
            if progress is not None:
                progress.update(1)
    else:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=min(cfg.workers, len(cands))) as pool:
            futs = [pool.submit(replay_candidate, trace, c, load, cfg, profile) for c in cands]
            out = []
            for f in futs:
                out.append(f.result())
                if progress is not None:
                    progress.update(1)
    summaries = [s for s, _ in out]
    seen: dict[str, None] = {}
    for _, ws in out:
        seen.update(dict.fromkeys(ws))
    return summaries, list(seen)


def tune(trace: Any, cfg: TuneConfig, progress: Any = None) -> TuneResult:
    """Search ``cfg.engine``'s knobs at every load of ``cfg`` on ``trace`` (a Trace, a path or
    a shipped trace's name); see the module docstring for the grid and the scoring."""
    from specsim.sim.config import ReplayConfig
    from specsim.sim.cost_profiles import get_profile
    from specsim.trace.io import read_trace
    from specsim.trace.model import Trace

    tr = trace if isinstance(trace, Trace) else read_trace(trace)
    for x in cfg.loads:  # each load as replay takes it: a one-line error before any replay
        ReplayConfig(**{cfg.load_kind: x}, cv=cfg.cv)
    if cfg.requests is not None:
        ReplayConfig(requests=cfg.requests)
    sla = Sla.from_config(cfg)
    profile = get_profile(cfg.profile)
    block = tr.block_size
    cands = candidates(cfg, block)
    obj, q = cfg.objective_name(), cfg.sla_quantile
    if progress is not None and not getattr(progress, "total", 1):
        progress.total = float(len(cands) * len(cfg.loads))
    results = []
    for x in cfg.loads:
        load = Load(cfg.load_kind, int(x) if cfg.closed else x)
        summaries, warns = _run_rows(tr, cands, load, cfg, profile, progress)
        rows = [_row(c, load, s, cfg, sla) for c, s in zip(cands, summaries, strict=True)]
        results.append(_score(rows, cands, load, obj, q, cfg.engine, tuple(warns)))
    extra: dict[str, Any] = {}
    sched = tuned_schedule(results, obj) if cfg.engine == "trtllm" and cfg.closed else None
    if sched is not None and len(cfg.loads) > 1:
        cand = schedule_candidate(sched, "tuned across these loads")
        cands = [*cands, cand]
        for i, lr in enumerate(results):  # the schedule replayed at every load, as a grid row
            s, warns = replay_candidate(tr, cand, lr.load, cfg, profile)
            rows = [*lr.rows, _row(cand, lr.load, s, cfg, sla)]
            results[i] = _score(rows, cands, lr.load, obj, q, cfg.engine, lr.warnings)
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
    )


def _score(rows: list[dict], cands: list[Candidate], load: Load, obj: str, q: int, engine: str,
           warns: tuple[str, ...]) -> LoadResult:  # fmt: skip
    """Mark the best row of one load and say how the default compares."""
    for r in rows:
        r["best"] = False
    best = pick_best(rows, obj)
    if best is not None:
        rows[best]["best"] = True
    d = next(i for i, c in enumerate(cands) if c.role == "default")
    n = next(i for i, c in enumerate(cands) if c.role == "no-spec")
    verdict = explain(rows, best, d, load, obj, q, engine)
    return LoadResult(load, rows, best, d, n, verdict, warns)


def _fixed_len(policy: str) -> int | None:
    """The draft length of a constant-length setting (``ar`` 0, ``static:k`` k), else None."""
    if policy == "ar":
        return 0
    name, _, arg = policy.partition(":")
    return int(arg) if name == "static" and arg.isdigit() else None


def tuned_schedule(results: list[LoadResult], objective: str) -> tuple[tuple[int, int], ...] | None:
    """TensorRT-LLM's ``draft_len_schedule`` from the searched closed-loop loads: at each load C
    the best fixed draft length meeting the SLA (0: no speculation), for batch sizes up to C
    (``get_draft_len_for_batch_size``: the first key >= the batch), never longer at a larger
    batch than at a smaller one (the engine's validator refuses it); runs of one length merged
    into their largest key, and speculation off above the largest load searched (the rule's
    own behaviour above its last key). None when no load has a fixed length worth drafting."""
    sign = 1.0 if maximize(objective) else -1.0
    pairs: list[tuple[int, int]] = []
    for lr in sorted(results, key=lambda r: float(r.load.value)):
        fixed = [
            (r["objective"], -_fixed_len(r["policy"]), r)
            for r in lr.rows
            if _fixed_len(r["policy"]) is not None and r["sla_met"]
        ]
        if not fixed:
            continue
        best = max(fixed, key=lambda t: (sign * t[0], t[1]))[2]
        pairs.append((int(lr.load.value), _fixed_len(best["policy"]) or 0))
    # TensorRT-LLM's validator (DecodingBaseConfig.validate_draft_len_schedule_and_sort in
    # llm_args.py) wants the smallest batch's length = max_draft_len >= every other length: a
    # length that grows with the load is raised at the smaller batches (the candidate is
    # replayed like any other, so the table shows what that costs).
    for i in range(len(pairs) - 2, -1, -1):
        pairs[i] = (pairs[i][0], max(pairs[i][1], pairs[i + 1][1]))
    merged: list[tuple[int, int]] = []
    for c, k in pairs:
        if merged and merged[-1][1] == k:
            merged[-1] = (c, k)
        else:
            merged.append((c, k))
    while merged and merged[-1][1] == 0:
        merged.pop()
    return tuple(merged) if merged else None


# ------------------------------------------------------------------ by how much, and why
def _change(new: float, old: float) -> str:
    if not (math.isfinite(new) and math.isfinite(old)) or old == 0:
        return "n/a"
    pct = 100.0 * (new - old) / abs(old)
    return f"{pct:+.1f}%" if abs(pct) < 10 else f"{pct:+.0f}%"


def explain(rows: list[dict], best: int | None, default: int, load: Load, objective: str,
            q: int, engine: str) -> str:  # fmt: skip
    """One or two sentences: the default against the best, by how much, and the mechanism
    (drafts verified a step, tokens it accepts, what the step costs)."""
    d = rows[default]
    if best is None:
        return (
            f"no setting meets the SLA at {load.describe()}; the default misses it by "
            f"{d['sla_misses'] or 'nothing'}: lower the load or relax the SLA"
        )
    b = rows[best]
    if best == default:
        return f"the default ({d['candidate']}) is the best setting at {load.describe()}"
    unit = "tok/s" if objective == "throughput" else "req/s" if objective == "goodput" else "ms"
    spec = ",.0f" if objective == "throughput" else ".2f"
    change = _change(b["objective"], d["objective"])
    if not maximize(objective) and change.startswith("-"):
        change = f"{change[1:]} lower"
    how = (
        f"{b['candidate']} ({_num(b['objective'], spec)} {unit}) against the default "
        f"{d['candidate']} ({_num(d['objective'], spec)} {unit}): {change}"
    )
    if not d["sla_met"]:
        how += f"; the default misses the SLA ({d['sla_misses']})"
    elif _tie(b["objective"], d["objective"]):
        return (
            f"at {load.describe()}, the default ({d['candidate']}, {_num(d['objective'], spec)} "
            f"{unit}) is within {100 * TIE_SHARE:g}% of the best ({b['candidate']}, "
            f"{_num(b['objective'], spec)} {unit}, {_change(b['objective'], d['objective'])}): "
            "a difference one seed's replay does not resolve, so keep the default"
        )
    return f"at {load.describe()}, {how}. {_mechanism(d, b, load)}"


def _tie(a: float, b: float) -> bool:
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= TIE_SHARE * abs(b)


def _mechanism(d: dict, b: dict, load: Load) -> str:
    """Why, in the terms throughput is made of: tokens a request-step and seconds a step."""
    if b["role"] == "no-spec":
        return (
            f"Speculation does not pay here: the default verifies {d['verified_per_step']:.1f} "
            f"drafts a request each step and gains {d['tau'] - 1:.2f} tokens a step for it, "
            f"while its steps take {d['step_ms']:.2f} ms against {b['step_ms']:.2f} ms "
            f"({_change(d['step_ms'], b['step_ms'])})."
        )
    dv = d["verified_per_step"] - b["verified_per_step"]
    step = _change(d["step_ms"], b["step_ms"])
    close = 0.05 + 0.05 * b["verified_per_step"]  # within 5%: the same number of drafts
    if dv > close:
        return (
            f"Verifying {d['verified_per_step']:.1f} drafts a request each step (the default) "
            f"instead of {b['verified_per_step']:.1f} makes a step {d['step_ms']:.2f} ms against "
            f"{b['step_ms']:.2f} ms ({step}), more than the {d['tau'] - b['tau']:+.2f} tokens a "
            f"step it accepts beyond the best's pay for ({d['tau']:.2f} vs {b['tau']:.2f} tokens "
            f"per request-step)."
        )
    if dv < -close:
        return (
            f"The default verifies too few: {b['verified_per_step']:.1f} drafts a request each "
            f"step accept {b['tau'] - d['tau']:+.2f} tokens a step more ({b['tau']:.2f} vs "
            f"{d['tau']:.2f}) for steps of {b['step_ms']:.2f} ms against {d['step_ms']:.2f} ms."
        )
    return (
        f"Both verify about {b['verified_per_step']:.1f} drafts a request each step; the best "
        f"picks which ones better: {b['tau']:.2f} vs {d['tau']:.2f} tokens per request-step, "
        f"steps of {b['step_ms']:.2f} ms vs {d['step_ms']:.2f} ms."
    )


__all__ = [
    "ENGINES",
    "OBJECTIVES",
    "Candidate",
    "Load",
    "LoadResult",
    "Sla",
    "TuneConfig",
    "TuneResult",
    "candidates",
    "explain",
    "pick_best",
    "truncate_block",
    "tune",
]
