"""Which drafter at which load: ``specsim tune --family NAME=TRACE@PROFILE`` (two or more).

Why: a deployment choosing between drafters (DSpark, EAGLE-3, MTP, n-gram, ...) is choosing a
pair: the drafter's acceptance on the workload (its TRACE: ``traces synth --al 3.2
--block-size 3`` for an EAGLE-3-like chain, or a recorded one) and what drafting costs on the
deployment (its PROFILE: ``profile build --drafter eagle3|mtp:3|dspark:...``, the drafter in
the profile's draft terms). A drafter that accepts more may cost more a step, and which wins
moves with the load: at one request in flight the step is weight-bound and more accepted tokens
are nearly free; at 64 the verified tokens fill the step.

Each family is tuned exactly as ``tune`` tunes one drafter (:func:`specsim.analysis.tune.run.
tune`, its own knobs: DSpark's grid, adaptive verification included; the others a chain of k,
:mod:`specsim.analysis.tune.family_configs`), with the SAME seeds for every family (common
random numbers across families too: the same arrivals, the same requests where the traces hold
the same workload). Then at each load each family's pick (tune's recommendation for it) is
ranked against the others' with tune's own rule: the best is the highest mean meeting the SLA,
every other family's paired difference to it gets a 95% interval over the seeds, and those
within noise TIE with it. No speculation is always a row: ``none@PROFILE`` replays speculation
off on that profile (any family's profile: speculation off pays no draft term) with the first
family's trace's requests; without it, the first family's own no-speculation row stands in.

``FAMILY_TIE_RULE``: among the families within noise of the best, none if it is one (a drafter
the search cannot tell from no speculation is not worth deploying), else the family picked at
the nearest lower load if it is one (fewer bands to run), else the best. The picks form BANDS of
consecutive loads with one (family, setting), each with the config to paste.

The specs, and what is refused or warned about before any replay:
:mod:`specsim.analysis.tune.family_configs`.

Sequential drafters (EAGLE, MTP) draft one position a forward, so their cost grows with k: a
built profile prices a call as its fixed part (EAGLE's extend pass) plus k later steps
(``draft_step_curve``), so every k up to the built steps is priced as it runs; k above them is
left out (the profile's graphs and tree were built for those steps: build one with more,
``--drafter eagle3:steps=5``, and give it as a family of its own). A profile without a step
curve (imported, or built before it existed) charges its built steps at every k, and says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any

from specsim.analysis.tune.family_configs import (
    NONE,
    Family,
    Prepared,
    grid_for,
    parse_families,
    prepare,
    render_family,
)
from specsim.analysis.tune.grid import NO_SPEC
from specsim.analysis.tune.run import Load, TuneConfig, TuneResult, replay_candidate, tune
from specsim.analysis.tune.score import (
    LOOSE_CI_PCT,
    Sla,
    describe_objective,
    least_bad,
    make_row,
    mark_ties,
    maximize,
    paired_interval,
    pick_best,
    vs_best_text,
)

FAMILY_TIE_RULE = (
    "among the families within noise of the best: none if it is one (a drafter the search "
    "cannot tell from no speculation is not worth deploying), else the family picked at the "
    "nearest lower load if it is one (fewer bands), else the best"
)


# ------------------------------------------------------------------ one load, ranked
@dataclass(frozen=True, eq=False)
class FamilyLoad:
    """One load: a row per family (its pick, marked against the best family), each family's
    objective at each seed, the best / recommended / none rows, and the verdict."""

    load: Load
    rows: list[dict]
    samples: list[list[float]]
    best: int | None
    recommended: int | None
    none: int
    verdict: str

    @property
    def recommended_row(self) -> dict | None:
        return None if self.recommended is None else self.rows[self.recommended]


def rank_load(load: Load, rows: list[dict], samples: list[list[float]], objective: str,
              none: int, prev: str | None = None) -> FamilyLoad:  # fmt: skip
    """Mark the best family (the highest mean meeting the SLA), the families within noise of
    it (tune's paired rule), each family against no speculation, and the recommended one
    (``FAMILY_TIE_RULE``; ``prev``: the family picked at the nearest lower load)."""
    best = pick_best(rows, objective)
    mark_ties(rows, samples, best)
    ref = rows[none]["objective"]
    for r, x in zip(rows, samples, strict=True):
        mean, half = paired_interval(x, samples[none])
        scale = 100.0 / abs(ref) if ref and math.isfinite(ref) else math.nan
        r.update(vs_none_pct=mean * scale, vs_none_ci_pct=half * scale)
    rec = None
    if best is not None:
        ties = [i for i, r in enumerate(rows) if i == best or r["within_noise"]]
        prefer = [none] + [i for i in ties if rows[i]["family"] == prev]
        rec = next((i for i in prefer if i in ties), best)
    for i, r in enumerate(rows):
        r["recommended"] = i == rec
    return FamilyLoad(load, rows, samples, best, rec, none, _verdict(rows, best, rec, none, load))


def vs_none_text(r: dict) -> str:
    """``+61.2% +-3.0%``: the paired difference to no speculation, in % of its objective."""
    pct, ci = r.get("vs_none_pct", math.nan), r.get("vs_none_ci_pct", math.nan)
    if not math.isfinite(pct):
        return "n/a"
    return f"{pct:+.1f}%" + (f" +-{ci:.1f}%" if math.isfinite(ci) else "")


def _who(r: dict) -> str:
    return NONE if r["family"] == NONE else f"{r['family']} {r['candidate']}"


def _verdict(rows: list[dict], best: int | None, rec: int | None, none: int, load: Load) -> str:
    """One or two sentences: the pick, by how much it beats no speculation, and which families
    the search cannot tell from it."""
    if best is None or rec is None:
        lb = rows[least_bad(rows)]
        return (
            f"no family meets the SLA at {load.describe()}; the least-bad is {_who(lb)} "
            f"({lb['sla_misses']}): lower the load or relax the SLA"
        )
    r, b = rows[rec], rows[best]
    if rec == none:
        text = f"at {load.describe()}, no speculation " + (
            "is the best: no drafter pays here." if rec == best
            else f"is within noise of the best ({_who(b)}, {vs_best_text(rows[none])}): no "
            "drafter pays more than the noise here, so keep speculation off."
        )  # fmt: skip
        return text + _loose(rows)
    text = f"at {load.describe()}, {_who(r)} is " + (
        "the best" if rec == best
        else f"within noise of the best ({_who(b)}, {vs_best_text(r)}), the tie rule's pick"
    )  # fmt: skip
    text += f", {vs_none_text(r)} against no speculation"
    ties = [f"{_who(x)} {vs_best_text(x)}" for i, x in enumerate(rows)
            if x["within_noise"] and i not in (rec, none)]  # fmt: skip
    if ties:
        text += f"; within noise of the best too: {', '.join(ties)}"
    return text + "." + _loose(rows)


def _loose(rows: list[dict]) -> str:
    """Tune's warning for ties whose interval is wide: more seeds would separate them."""
    wide = [
        r["vs_best_ci_pct"]
        for r in rows
        if r["within_noise"] and r["vs_best_ci_pct"] > LOOSE_CI_PCT
    ]  # fmt: skip  (NaN: no)
    if not wide:
        return ""
    return (
        f" Some ties are loose (an interval up to +-{max(wide):.0f}% of the best): more --seeds "
        "or --requests would tell the families apart."
    )


# ------------------------------------------------------------------ the search
@dataclass(frozen=True)
class Band:
    """Consecutive loads (by value) with one recommendation: the family, its setting and the
    config to paste (None where no family meets the SLA)."""

    loads: tuple[Load, ...]
    family: str | None
    setting: str
    config: Any = None

    def span(self) -> str:
        """``C 1-4``, ``2-8 req/s`` or ``arrivals FILE``."""
        lo, hi = self.loads[0], self.loads[-1]
        if lo.kind == "concurrency":
            return f"C {int(lo.value)}" + (f"-{int(hi.value)}" if hi is not lo else "")
        if lo.kind == "rate":
            return f"{lo.value:g}" + (f"-{hi.value:g}" if hi is not lo else "") + " req/s"
        return lo.describe()

    def describe(self) -> str:
        return f"{self.span()}: " + (
            "none meets the SLA" if self.family is None
            else NONE if self.family == NONE else f"{self.family} {self.setting}"
        )  # fmt: skip


@dataclass(frozen=True, eq=False)
class FamiliesResult:
    """Every family's tune result (by name), every load ranked, the bands, and how."""

    config: TuneConfig
    families: list[Family]
    results: dict[str, TuneResult]
    loads: list[FamilyLoad]
    bands: list[Band]
    sla: Sla
    objective: str
    objective_text: str
    none_source: str
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    one_for_all: tuple[str, float] | None = None
    tie_rule: str = FAMILY_TIE_RULE

    @property
    def seeds(self) -> tuple[int, ...]:
        return self.config.seed_list

    def frame(self):  # noqa: ANN201 - pandas.DataFrame
        """One row per load x family: tune's columns, ``family`` first, the marks across
        families (``best``, ``within_noise``, ``recommended``, ``vs_best*``, ``vs_none*``)."""
        import pandas as pd

        return pd.DataFrame([r for fl in self.loads for r in fl.rows])


def tune_families(specs: Sequence[str], cfg: TuneConfig,
                  progress: Callable[[str], Any] | None = None) -> FamiliesResult:  # fmt: skip
    """Tune every family (``NAME=TRACE@PROFILE`` / ``none@PROFILE`` specs) at every load of
    ``cfg`` and rank them (module docstring). ``progress``: a family's name -> a context
    manager giving its progress bar (None: quiet)."""
    prepared, warns = prepare(parse_families(specs), cfg)
    drafters = [p for p in prepared if not p.family.is_none]
    bar = progress or (lambda _name: nullcontext())
    results: dict[str, TuneResult] = {}
    for p in drafters:
        with bar(p.family.name) as b:
            grid = grid_for(p.family.method, p.family.max_k)
            results[p.family.name] = tune(p.trace, p.cfg, b, grid=grid)
    first = results[drafters[0].family.name]
    base = next((p for p in prepared if p.family.is_none), None)
    with bar(NONE) if base is not None else nullcontext() as b:
        none_rows, none_src, none_warns = _none_rows(base, drafters[0], first, b)
    loads, prev = [None] * len(first.loads), None
    for i in sorted(range(len(first.loads)), key=lambda j: _order(first.loads[j].load)):
        rows, samples = [], []
        for p in drafters:
            row, x = _pick(results[p.family.name].loads[i])
            rows.append(_labelled(row, p.family.name, p.family.method, p.trace, p.family.profile))
            samples.append(x)
        src = base if base is not None and base.trace is not None else drafters[0]
        prof = (base or drafters[0]).family.profile
        rows.append(_labelled(none_rows[i][0], NONE, NONE, src.trace, prof))
        samples.append(none_rows[i][1])
        fl = rank_load(first.loads[i].load, rows, samples, first.objective, len(rows) - 1, prev)
        loads[i] = fl
        prev = fl.recommended_row["family"] if fl.recommended_row else prev
    ranked = [fl for fl in loads if fl is not None]
    notes = [f"family {name}: {n}" for name, r in results.items() for n in r.notes]
    notes += [_priced_note(p.family) for p in drafters if p.family.max_k]
    return FamiliesResult(
        config=cfg, families=[p.family for p in prepared], results=results, loads=ranked,
        bands=_bands(ranked, prepared, results, cfg.engine), sla=first.sla,
        objective=first.objective,
        objective_text=describe_objective(first.objective, cfg.closed, cfg.sla_quantile),
        none_source=none_src, notes=tuple(dict.fromkeys(notes)),
        warnings=tuple(dict.fromkeys([*warns, *none_warns, *_tune_warnings(drafters, results)])),
        one_for_all=one_for_all(ranked, first.objective),
    )  # fmt: skip


def _priced_note(f: Family) -> str:
    """What a sequential drafter's profile charges at each k (module docstring)."""
    return (
        f"family {f.name}: its profile prices up to {f.max_k} draft steps, so k above "
        f"{f.max_k} is left out (build one with more steps as a family of its own); below it "
        "each k pays its own steps where the profile has a draft step curve, else the built "
        f"{f.max_k} (overstated)"
    )


def _order(load: Load) -> float:
    """Loads from light to heavy (an arrivals file is one load: no order to keep)."""
    return 0.0 if load.kind == "arrivals" else float(load.value)


def _pick(lr: Any) -> tuple[dict, list[float]]:
    """A family's row at one load: tune's recommendation, or the least-bad where none of its
    settings meets the SLA."""
    i = lr.recommended if lr.recommended is not None else least_bad(lr.rows)
    return lr.rows[i], lr.samples[i]


def _labelled(row: dict, family: str, method: str | None, trace: Any, profile: str) -> dict:
    """A copy of a family's row (its own table keeps its marks), named and sourced."""
    return {"family": family, **row, "method": method or "",
            "trace": str(getattr(trace, "path", "") or ""), "profile": profile}  # fmt: skip


def _none_rows(base: Prepared | None, first: Prepared, res: TuneResult, bar: Any
               ) -> tuple[list[tuple[dict, list[float]]], str, list[str]]:  # fmt: skip
    """No speculation at every load: replayed on ``none@PROFILE`` with the seeds of every
    family (the first family's requests where it names no trace), else the first family's own
    no-speculation row. With how it was made, in words, and its replays' warnings."""
    if base is None:
        rows = [(lr.rows[lr.no_spec], lr.samples[lr.no_spec]) for lr in res.loads]
        return (
            rows,
            f"speculation off on {first.family.name}'s profile ({first.family.profile})",
            [],
        )
    trace = base.trace if base.trace is not None else first.trace
    c = replace(base.cfg, draft_lens=None)
    sla, gpus = Sla.from_config(c), int(getattr(base.profile, "gpus", 1) or 1)
    rows, warns = [], []
    for lr in res.loads:
        sums = []
        for s in c.seed_list:
            summary, w = replay_candidate(trace, NO_SPEC, lr.load, c, base.profile, s)
            sums.append(summary)
            warns += [f"none: {x}" for x in w]
            if bar is not None and hasattr(bar, "update"):
                bar.update(1)
        rows.append(make_row(NO_SPEC, lr.load, sums, c, sla, gpus))
    who = "its own trace" if base.trace is not None else f"{first.family.name}'s requests"
    return rows, f"none@{base.family.profile}, speculation off, with {who}", warns


def _tune_warnings(drafters: list[Prepared], results: dict[str, TuneResult]) -> list[str]:
    """Each family's replay warnings; the trace-against-deployment one for DSpark families only
    (its range is DSpark's published tau)."""
    out = []
    for p in drafters:
        res = results[p.family.name]
        if p.family.method == "dspark" and res.acceptance.get("warning"):
            out.append(f"family {p.family.name}: {res.acceptance['warning']}")
        out += [f"family {p.family.name}: {w}" for lr in res.loads for w in lr.warnings]
    return out


def _bands(loads: list[FamilyLoad], prepared: list[Prepared], results: dict[str, TuneResult],
           engine: str) -> list[Band]:  # fmt: skip
    """Consecutive loads (by value) with the same recommended family and setting, each with
    its config."""
    by = {p.family.name: p.family for p in prepared}
    bands: list[Band] = []
    for fl in sorted(loads, key=lambda x: _order(x.load)):
        r = fl.recommended_row
        key = (None, "") if r is None else (r["family"], r["candidate"])
        if bands and (bands[-1].family, bands[-1].setting) == key:
            bands[-1] = replace(bands[-1], loads=(*bands[-1].loads, fl.load))
            continue
        config = None
        if r is not None:
            config = setting_config(
                r, by.get(r["family"]), results.get(r["family"]), engine, fl.load
            )
        bands.append(Band((fl.load,), key[0], key[1], config))
    return bands


def setting_config(row: dict, fam: Family | None, res: TuneResult | None, engine: str,
                   load: Load) -> Any:  # fmt: skip
    """The config to paste for a family's pick (speculation off for none)."""
    if res is None or fam is None or row["role"] == "no-spec":
        return render_family(engine, NONE, {})
    lr = next(x for x in res.loads if x.load == load)
    pool = lr.candidates or res.candidates
    cand = next(c for c in pool if c.label == row["candidate"])
    return render_family(engine, fam.method, cand.knob_dict(), block=res.block, label=fam.name)


def one_for_all(loads: list[FamilyLoad], objective: str) -> tuple[str, float] | None:
    """Over several loads, the family whose pick is nearest each load's best at its worst
    load (its largest shortfall, in % of the best's objective, >= 0): the one drafter to serve
    if one deployment takes them all. None for one load, or where no family meets the SLA at
    every load."""
    if len(loads) < 2:
        return None
    sign = -1.0 if maximize(objective) else 1.0  # a shortfall is below the best, or above it
    worst: dict[str, float] = {}
    for fl in loads:
        for r in fl.rows:
            pct = sign * r.get("vs_best_pct", math.nan)
            ok = r["sla_met"] and math.isfinite(pct) and fl.best is not None
            worst[r["family"]] = max(worst.get(r["family"], 0.0), pct if ok else math.inf)
    name, pct = min(worst.items(), key=lambda kv: kv[1])
    return (name, max(pct, 0.0)) if math.isfinite(pct) else None


__all__ = [
    "FAMILY_TIE_RULE",
    "Band",
    "FamiliesResult",
    "Family",
    "FamilyLoad",
    "rank_load",
    "setting_config",
    "tune_families",
    "vs_none_text",
]
