"""What ``tune`` scores a setting by, and how it says so (split from
:mod:`specsim.analysis.tune.run`, which runs the replays): the SLA a setting must meet, the
objective's number, the paired interval of each setting's difference to the best over the
seeds, the tie rule that turns the settings within noise of the best into one recommendation,
whether the trace's acceptance fits the profile's deployment, and the verdict's sentences.

Ties. Every setting is replayed with the same seeds (common random numbers), so the difference of
a setting to the best is paired seed by seed: its mean and a 95% Student-t interval over the
seeds. A setting meeting the SLA whose interval holds 0, or whose mean difference is under
``TIE_SHARE`` of the best's objective, is WITHIN NOISE of the best: the search does not resolve
them, and which of them has the highest mean changes with the seeds. The recommendation is then
(``TIE_RULE``) the engine's default if it is within noise (nothing to change), else the tied
setting nearest the default (fewest knobs changed, then the nearest draft length, then the
table's order): the smallest change that the search cannot tell from the best, and one that
keeps the recorded block's length where it can (predicted without truncating the block). Not
"no speculation first": with few seeds an interval is wide, and the setting farthest from the
default is the largest bet on it; the verdict says when no speculation ties too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specsim.errors import SpecsimError

# Differences smaller than this share of the best's objective are ties whatever the interval
# (with one seed, the only rule): not worth a config change.
TIE_SHARE = 0.01
CONFIDENCE = 0.95
TIE_RULE = (
    "among the settings within noise of the best, the engine's default if it is one, else the "
    "one nearest the default (fewest knobs changed, then the nearest draft length)"
)
LOOSE_CI_PCT = 10.0  # a tie whose interval is wider than this (% of the best) is a loose one


# ------------------------------------------------------------------ the SLA and the score
@dataclass(frozen=True)
class Sla:
    """Every ``slo`` latency's ``quantile`` percentile at most its bound (ms), and the mean
    per-user speed at least ``tps``; nothing given: every row meets it."""

    slo_ms: tuple[tuple[str, float], ...] = ()
    tps: float | None = None
    quantile: int = 90

    @classmethod
    def from_config(cls, cfg: Any) -> Sla:
        from specsim.sim.metrics import parse_slo

        slo = parse_slo(cfg.slo) or {}
        if cfg.sla_tps is not None and not (math.isfinite(cfg.sla_tps) and cfg.sla_tps > 0):
            raise SpecsimError(f"--sla-tps must be a positive number, got {cfg.sla_tps}")
        return cls(tuple(slo.items()), cfg.sla_tps, int(cfg.sla_quantile))

    def misses(self, s: dict[str, Any]) -> list[str]:
        """What a summary misses, in words (empty: it meets the SLA)."""
        out = []
        for key, bound in self.slo_ms:
            v = s.get(f"{key}_ms_p{self.quantile}")
            if v is None or not math.isfinite(v) or v > bound:
                out.append(f"P{self.quantile} {key.upper()} {_num(v, '.1f')} ms > {bound:g}")
        if self.tps is not None:
            v = s.get("per_user_tps_mean")
            if v is None or not math.isfinite(v) or v < self.tps:
                out.append(f"mean per-user speed {_num(v, '.1f')} tok/s < {self.tps:g}")
        return out

    def shortfall(self, s: dict[str, Any]) -> float:
        """How far a summary is from the SLA: the largest of each latency over its bound and
        the per-user speed's bound over the speed (at most 1: it meets it; inf: unmeasured).
        What ranks the least-bad setting when none meets the SLA."""
        ratios = [0.0]
        for key, bound in self.slo_ms:
            v = s.get(f"{key}_ms_p{self.quantile}")
            ok = v is not None and math.isfinite(v)
            ratios.append(float(v) / bound if ok else math.inf)
        if self.tps is not None:
            v = s.get("per_user_tps_mean")
            ok = v is not None and math.isfinite(v) and v > 0
            ratios.append(self.tps / float(v) if ok else math.inf)
        return max(ratios)

    def describe(self) -> str:
        parts = [f"P{self.quantile} {k.upper()} <= {v:g} ms" for k, v in self.slo_ms]
        if self.tps is not None:
            parts.append(f"mean per-user speed >= {self.tps:g} tok/s")
        return " and ".join(parts) if parts else "no SLA given (every setting qualifies)"


def _num(v: Any, spec: str) -> str:
    return "n/a" if v is None or not math.isfinite(float(v)) else f"{v:{spec}}"


def throughput(s: dict[str, Any], closed: bool) -> float:
    """Steady-state output tok/s of a closed loop (warm-up and drain excluded), whole-run
    output tok/s otherwise (and where the closed loop had no steady window)."""
    steady = s.get("steady_throughput_tok_s")
    if closed and steady is not None and math.isfinite(steady):
        return float(steady)
    return float(s["throughput_tok_s"])


def objective_value(s: dict[str, Any], objective: str, closed: bool, q: int) -> float:
    """The objective's number for one summary (its unit in :func:`describe_objective`)."""
    if objective == "throughput":
        return throughput(s, closed)
    if objective == "goodput":
        v = s.get("goodput_req_s")
        return float("nan") if v is None else float(v)
    return float(s[f"{objective}_ms_p{q}"])


def maximize(objective: str) -> bool:
    return objective in ("throughput", "goodput")


def describe_objective(objective: str, closed: bool, q: int) -> str:
    return {
        "throughput": "steady-state output throughput of the whole deployment (tok/s), higher "
        "is better"
        if closed
        else "output throughput of the whole deployment (tok/s), higher is better",
        "goodput": "goodput (requests/s meeting every --slo), higher is better",
        "tpot": f"P{q} TPOT (ms), lower is better",
        "ttft": f"P{q} TTFT (ms), lower is better",
    }[objective]


# ------------------------------------------------------------------ a row: the seeds' mean
def _mean_summary(sums: list[dict[str, Any]]) -> dict[str, Any]:
    """The seeds' summaries as one: every number their mean."""
    out: dict[str, Any] = {}
    for k, v in sums[0].items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            vals = [s.get(k) for s in sums]
            out[k] = math.nan if None in vals else sum(map(float, vals)) / len(vals)
        else:
            out[k] = v
    return out


def make_row(cand: Any, load: Any, sums: list[dict], cfg: Any, sla: Sla,
             gpus: int) -> tuple[dict, list[float]]:  # fmt: skip
    """One table row (the setting, the mean over the seeds of the predicted numbers, the SLA
    verdict and the score) and the objective at each seed (paired across rows)."""
    q, obj = cfg.sla_quantile, cfg.objective_name()
    s = _mean_summary(sums)
    tau, eff = float(s["tau"]), float(s["verify_efficiency"])
    verified = (tau - 1.0) / eff if s["verified_draft_tokens"] and eff > 0 else 0.0
    misses = sla.misses(s)
    per_seed = [objective_value(x, obj, cfg.closed, q) for x in sums]
    tput = sum(throughput(x, cfg.closed) for x in sums) / len(sums)
    steps = [1000.0 * float(x["sim_time_s"]) / max(int(x["engine_steps"]), 1) for x in sums]
    row = {
        "load_kind": load.kind,
        "load": load.value,
        "candidate": cand.label,
        "role": cand.role,
        "policy": cand.policy,
        "block": cand.block,
        "knobs": cand.knob_text(),
        "seeds": len(sums),
        "gpus": int(gpus),
        "throughput_tok_s": tput,  # the whole deployment's (all its GPUs)
        "throughput_per_gpu_tok_s": tput / max(int(gpus), 1),
        "tpot_ms_p50": float(s["tpot_ms_p50"]),
        f"tpot_ms_p{q}": float(s[f"tpot_ms_p{q}"]),
        "ttft_ms_p90": float(s["ttft_ms_p90"]),
        f"ttft_ms_p{q}": float(s[f"ttft_ms_p{q}"]),
        "per_user_tps_mean": float(s["per_user_tps_mean"]),
        "goodput_req_s": s.get("goodput_req_s"),
        "tau": tau,
        "verified_per_step": verified,
        "step_ms": sum(steps) / len(steps),  # sim time / steps: prompt chunks included
        "step_tokens": float(s["mean_batch_tokens"]),  # tokens a step, prompt chunks included
        "sla_met": not misses,
        "sla_misses": "; ".join(misses),
        "sla_shortfall": sla.shortfall(s),  # <= 1: met; else how far over (least-bad ranks)
        "sla_seeds_met": sum(not sla.misses(x) for x in sums),
        "objective": sum(per_seed) / len(per_seed),
        "best": False,
        "recommended": False,
    }
    return row, per_seed


# the last advice when nothing meets the SLA (dropped where tune already searched the limit)
BATCHED_HINT = (
    ", or give the engine another batched-token limit (tune --max-batched-tokens searches it)"
)


def least_bad(rows: list[dict]) -> int:
    """Where no setting meets the SLA, the one nearest it (the smallest shortfall; the first on
    a tie: no speculation, then the default, come first)."""
    return min(range(len(rows)), key=lambda i: (rows[i].get("sla_shortfall", math.inf), i))


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


# ------------------------------------------------------------------ paired differences, ties
def paired_interval(x: list[float], best: list[float]) -> tuple[float, float]:
    """(mean, half-width) of the seed-by-seed difference ``x - best``: a ``CONFIDENCE``
    Student-t interval over the seeds (half-width NaN with one seed: no interval)."""
    d = [a - b for a, b in zip(x, best, strict=True)]
    n = len(d)
    mean = sum(d) / n if n else float("nan")
    if n < 2 or not math.isfinite(mean):
        return mean, float("nan")
    from scipy.stats import t

    sd = math.sqrt(sum((v - mean) ** 2 for v in d) / (n - 1))
    return mean, float(t.ppf(0.5 + CONFIDENCE / 2, n - 1)) * sd / math.sqrt(n)


def within_noise(mean: float, half: float, best: float) -> bool:
    """A difference the search does not resolve: its interval holds 0, or it is under
    ``TIE_SHARE`` of the best's objective."""
    if not math.isfinite(mean):
        return False
    return (math.isfinite(half) and abs(mean) <= half) or abs(mean) <= TIE_SHARE * abs(best)


def mark_ties(rows: list[dict], samples: list[list[float]], best: int | None) -> None:
    """Each row's paired difference to the best (``vs_best``, its interval's half-width
    ``vs_best_ci``, both also in % of the best's objective) and ``within_noise``."""
    for i, r in enumerate(rows):
        r["best"] = i == best
        r.update(vs_best=math.nan, vs_best_ci=math.nan, vs_best_pct=math.nan,
                 vs_best_ci_pct=math.nan, within_noise=False)  # fmt: skip
        if best is None:
            continue
        mean, half = paired_interval(samples[i], samples[best])
        ref = abs(rows[best]["objective"]) or 1.0
        r.update(vs_best=mean, vs_best_ci=half, vs_best_pct=100 * mean / ref,
                 vs_best_ci_pct=100 * half / ref)  # fmt: skip
        r["within_noise"] = (
            i != best and r["sla_met"] and within_noise(mean, half, rows[best]["objective"])
        )


# ------------------------------------------------------------------ the tie rule's order
def draft_len(cand: Any) -> int:
    """The most drafts a setting verifies a step (its first knob; no speculation: 0)."""
    return int(cand.knobs[0][1]) if cand.knobs else 0


def distance_from_default(cand: Any, default: Any) -> tuple[int, int]:
    """(knobs whose value differs from the default's, |draft length - the default's|): the
    tie rule keeps the setting nearest what the engine runs by default."""
    mine, theirs = cand.knob_dict(), default.knob_dict()
    changed = sum(mine.get(k) != theirs.get(k) for k in {*mine, *theirs})
    return changed, abs(draft_len(cand) - draft_len(default))


def recommend(rows: list[dict], cands: list[Any], best: int | None, default: int) -> int | None:
    """The setting to deploy: the best, or by ``TIE_RULE`` one within noise of it."""
    if best is None:
        return None
    ties = [i for i, r in enumerate(rows) if i == best or r.get("within_noise")]
    if default in ties:
        return default
    return min(ties, key=lambda i: (distance_from_default(cands[i], cands[default]), i))


# ------------------------------------------------------------------ the trace against the profile
# The acceptance a profile's deployment would see: its production DSpark drafter's. The DSpark
# paper's drafters accept tau 3.2-3.7 on chat benchmarks and 5.2-6.2 on code and math (Table 1;
# traces/SYNTHETIC.md); the profiles below model GPU deployments that serve such a drafter. The
# CPU profile (smollm2-135m-cpu) and a profile CSV of your own say nothing of the drafter.
DEPLOYMENT_TAU = (3.0, 6.0)
TAU_SLACK = 0.5  # "far from": outside the range by more than this many tokens a step
# measured GPU tables, whose source line does not say it (built profiles' does: below)
DEPLOYMENTS = {"vllm-v4-flash-tp4-b300": "DeepSeek-V4-Flash on 4 B300 GPUs"}


BUILT = "specsim profile build: "  # how a built profile's source line starts


def deployment_of(profile: Any) -> tuple[str, str] | None:
    """(the profile's name, the GPU deployment it models) when it models one that would serve a
    DSpark drafter: the built-in GPU profiles, and every ``specsim profile build`` profile (a
    named model on named GPUs; its source line says which). None for the CPU profile, imported
    tables and hand-made CSVs, which say nothing of the drafter."""
    name = str(getattr(profile, "name", profile)).split("@")[0]
    if name in DEPLOYMENTS:
        return name, DEPLOYMENTS[name]
    meta = getattr(profile, "meta", None) or {}
    source = str(meta.get("source", ""))
    if source.startswith(BUILT):
        what = source.removeprefix(BUILT).split(", drafter ")[0]
        return str(meta.get("name") or name), what
    return None


def acceptance_check(trace: Any, profile: Any) -> dict[str, Any]:
    """The trace's tau (full verification, bonus token counted: ``specsim traces info``'s
    tau_replay) against the range the profile's deployment would see; ``warning`` is one line
    when it is far outside (None otherwise, or when the profile does not say). ``profile``: a
    profile's name or the CostModel (whose source line says whether ``profile build`` made it)."""
    from specsim.trace.stats import replay_full

    visited, _ = replay_full(trace)
    tau = float(trace.accept_len[visited].mean() + 1) if visited.size else float("nan")
    out: dict[str, Any] = {"trace_tau": tau, "expected_tau": None, "deployment": None,
                           "warning": None}  # fmt: skip
    found = deployment_of(profile)
    if found is None:
        return out
    base, deployment = found
    lo, hi = DEPLOYMENT_TAU
    out.update(expected_tau=[lo, hi], deployment=deployment)
    if math.isfinite(tau) and lo - TAU_SLACK <= tau <= hi + TAU_SLACK:
        return out
    path = getattr(trace, "path", None)
    name = Path(str(path)).name.removesuffix(".parquet") if path else "the trace"
    who = ", ".join(f"{k} {trace.meta[k]}" for k in ("target", "drafter") if trace.meta.get(k))
    out["warning"] = (
        f"trace {name} accepts tau {tau:.2f}{f' ({who})' if who else ''}, far from the tau "
        f"{lo:g}-{hi:g} that profile {base}'s deployment ({deployment}) would see with a "
        "DSpark drafter (the DSpark paper: 3.2-3.7 on chat, 5.2-6.2 on code and math), so this "
        "answer is for the trace's drafter, not that deployment's: tune a trace with "
        "paper-like acceptance (synthetic-chat tau 3.3, synthetic-code 5.3, synthetic-math 6.0) "
        "or your own drafter's trace (specsim record)"
    )
    return out


# ------------------------------------------------------------------ by how much, and why
def _change(new: float, old: float) -> str:
    if not (math.isfinite(new) and math.isfinite(old)) or old == 0:
        return "n/a"
    pct = 100.0 * (new - old) / abs(old)
    return f"{pct:+.1f}%" if abs(pct) < 10 else f"{pct:+.0f}%"


def _tie(a: float, b: float) -> bool:
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= TIE_SHARE * abs(b)


def _value(r: dict, objective: str) -> str:
    """A row's objective with its unit; throughput says it is the whole deployment's."""
    if objective == "throughput":
        gpus = r.get("gpus")
        where = f" over {gpus} GPUs" if gpus and gpus > 1 else " on 1 GPU" if gpus else ""
        return f"{_num(r['objective'], ',.0f')} tok/s{where}"
    unit = "req/s" if objective == "goodput" else "ms"
    return f"{_num(r['objective'], '.2f')} {unit}"


def vs_best_text(r: dict) -> str:
    """``-1.2% +-3.4%``: the paired difference to the best and its interval, in % of the best."""
    pct, ci = r.get("vs_best_pct", math.nan), r.get("vs_best_ci_pct", math.nan)
    if not math.isfinite(pct):
        return "n/a"
    return f"{pct:+.1f}%" + (f" +-{ci:.1f}%" if math.isfinite(ci) else "")


def explain(rows: list[dict], best: int | None, default: int, load: Any, objective: str,
            q: int, engine: str, recommended: int | None = None) -> str:  # fmt: skip
    """One or two sentences: the recommended setting against the default, by how much, and the
    mechanism (drafts verified a step, tokens it accepts, what the step costs); where the
    recommendation is not the highest mean, that it is within noise of it; and whether no
    speculation is within noise too, or the ties are loose."""
    text = _explain(rows, best, default, load, objective, recommended)
    if best is not None and not text.endswith((".", ".)")):
        text += "."
    spec_off = next((r for r in rows if r.get("role") == "no-spec"), None)
    if spec_off is not None and spec_off.get("within_noise"):
        text += (
            f" No speculation is within noise of the best too ({vs_best_text(spec_off)}): "
            "speculating buys nothing this search resolves."
        )
    loose = [r.get("vs_best_ci_pct", math.nan) for r in rows if r.get("within_noise")]
    if any(math.isfinite(x) and x > LOOSE_CI_PCT for x in loose):
        text += (
            f" Some ties are loose (an interval up to +-{max(loose):.0f}% of the best): more "
            "--seeds or --requests would tell more settings apart."
        )
    return text


def _explain(rows: list[dict], best: int | None, default: int, load: Any, objective: str,
             recommended: int | None) -> str:  # fmt: skip
    d = rows[default]
    if best is None:
        lb = rows[least_bad(rows)]
        over = 100.0 * (lb.get("sla_shortfall", math.inf) - 1.0)
        nearest = (
            f"the least-bad is {lb['candidate']} ({lb['knobs']}: {lb['sla_misses']}, "
            f"{_num(over, '.0f')}% over the SLA)"
        )
        if lb is not d:
            nearest += f"; the default misses it by {d['sla_misses'] or 'nothing'}"
        return (
            f"no setting meets the SLA at {load.describe()}; {nearest}: lower the load, relax "
            f"the SLA{BATCHED_HINT}"
        )
    rec = best if recommended is None else recommended
    b, r = rows[best], rows[rec]
    if best == default:
        text = f"the default ({d['candidate']}) is the best setting at {load.describe()}"
        if rec != default:
            text += (
                f"; {r['candidate']} is within noise of it ({vs_best_text(r)}), so the tie rule "
                f"recommends {r['candidate']}"
            )
        return text
    tied = d.get("within_noise", _tie(b["objective"], d["objective"]))
    if rec == default or (tied and "within_noise" not in d):
        return (
            f"at {load.describe()}, the default ({d['candidate']}, {_value(d, objective)}) is "
            f"within noise of the best ({b['candidate']}, {_value(b, objective)}, "
            f"{vs_best_text(d) if 'vs_best_pct' in d else _change(b['objective'], d['objective'])}"
            "): a difference this search does not resolve, so keep the default"
        )
    change = _change(r["objective"], d["objective"])
    if not maximize(objective) and change.startswith("-"):
        change = f"{change[1:]} lower"
    how = (
        f"{r['candidate']} ({_value(r, objective)}) against the default {d['candidate']} "
        f"({_value(d, objective)}): {change}"
    )
    if not d["sla_met"]:
        how += f"; the default misses the SLA ({d['sla_misses']})"
    elif tied:
        how += f"; the default is within noise of the best too ({vs_best_text(d)})"
    tail = ""
    if rec != best:
        tail = (
            f" {r['candidate']} is within noise of the highest mean ({b['candidate']}, "
            f"{_value(b, objective)}; {vs_best_text(r)}): the tie rule's pick."
        )
    return f"at {load.describe()}, {how}. {_mechanism(d, r)}{tail}"


def step_note(d: dict, b: dict) -> str:
    """What a "step" of the explanation is: the replay's mean, not ``profile show``'s price of
    one step at a token count (the two differ by the prompt chunks a step carries)."""
    tok = [r.get("step_tokens", math.nan) for r in (d, b)]
    held = " and ".join(_num(t, ",.0f") for t in tok)
    return (
        f"(Steps: the replay's mean, simulated time over engine steps, prompt chunks included; "
        f"they hold {held} tokens on average, the tokens profile show prices a step at.)"
    )


def _mechanism(d: dict, b: dict) -> str:
    """Why, in the terms throughput is made of: tokens a request-step and seconds a step."""
    if b["role"] == "no-spec":
        return (
            f"Speculation does not pay here: the default verifies {d['verified_per_step']:.1f} "
            f"drafts a request each step and gains {d['tau'] - 1:.2f} tokens a step for it, "
            f"while its steps take {d['step_ms']:.2f} ms against {b['step_ms']:.2f} ms "
            f"({_change(d['step_ms'], b['step_ms'])}). {step_note(d, b)}"
        )
    dv = d["verified_per_step"] - b["verified_per_step"]
    step = _change(d["step_ms"], b["step_ms"])
    close = 0.05 + 0.05 * b["verified_per_step"]  # within 5%: the same number of drafts
    if dv > close:
        return (
            f"Verifying {d['verified_per_step']:.1f} drafts a request each step (the default) "
            f"instead of {b['verified_per_step']:.1f} makes a step {d['step_ms']:.2f} ms against "
            f"{b['step_ms']:.2f} ms ({step}), more than the {d['tau'] - b['tau']:+.2f} tokens a "
            f"step it accepts beyond {b['candidate']}'s pay for ({d['tau']:.2f} vs "
            f"{b['tau']:.2f} tokens per request-step). {step_note(d, b)}"
        )
    if dv < -close:
        return (
            f"The default verifies too few: {b['verified_per_step']:.1f} drafts a request each "
            f"step accept {b['tau'] - d['tau']:+.2f} tokens a step more ({b['tau']:.2f} vs "
            f"{d['tau']:.2f}) for steps of {b['step_ms']:.2f} ms against {d['step_ms']:.2f} ms. "
            + step_note(d, b)
        )
    return (
        f"Both verify about {b['verified_per_step']:.1f} drafts a request each step; "
        f"{b['candidate']} picks which ones better: {b['tau']:.2f} vs {d['tau']:.2f} tokens per "
        f"request-step, steps of {b['step_ms']:.2f} ms vs {d['step_ms']:.2f} ms. {step_note(d, b)}"
    )
