"""The highest load each policy sustains under a per-user speed SLA, by binary search.

"Sustains" means the mean per-user decode speed (``per_user_tps_mean``, tok/s/user, averaged
over seed replicates) is at least the SLA. Per-user speed falls as load rises (a bigger batch
makes every step slower), so the feasible loads form an interval from the bottom of the range
and bisection finds its top. Each probe is an ordinary sweep cell, with the cell's seed, so a
probe at concurrency 32 gives exactly the row a sweep at concurrency 32 gives.
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace
from typing import Any

import pandas as pd

from specsim.analysis.cell_warnings import KEY, Tally
from specsim.analysis.grid import Cell
from specsim.analysis.sweep import _execute, build_cells, check_workers, run_cell
from specsim.errors import SpecsimError
from specsim.progress import Progress

SLA_METRIC = "per_user_tps_mean"


def _probe(cells: list[Cell], load: float, said: list) -> tuple[float, dict[str, Any]]:
    """Run every replicate of one (trace, policy) at ``load``; mean of the numeric summary.
    The cells' warnings go into ``said`` (the search returns them: :mod:`cell_warnings`)."""
    rows = [run_cell(replace(c, load=float(load))) for c in cells]
    said += [w for r in rows for w in r.pop(KEY, ())]
    frame = pd.DataFrame(rows)
    means = frame.mean(numeric_only=True).to_dict()
    return float(means[SLA_METRIC]), means


def search_one(
    cells: list[Cell], sla_tps: float, lo: float, hi: float, rel_tol: float = 0.02
) -> dict[str, Any]:
    """Bisect the load of one (trace, policy) between ``lo`` and ``hi`` (inclusive); the
    probes' warnings, each once, go back with the row (``find_max_load`` says them)."""
    said: list = []
    row = _search(cells, sla_tps, lo, hi, rel_tol, said)
    if said:
        row[KEY] = list(dict.fromkeys(said))
    return row


def _search(
    cells: list[Cell], sla_tps: float, lo: float, hi: float, rel_tol: float, said: list
) -> dict[str, Any]:
    first = cells[0]
    integer = first.load_kind == "concurrency"
    probes = 0

    def ok(load: float) -> tuple[bool, dict[str, Any]]:
        nonlocal probes
        probes += 1
        speed, means = _probe(cells, load, said)
        return speed >= sla_tps, means

    row: dict[str, Any] = {
        "trace": first.trace_name,
        "policy": first.policy,
        "profile": first.profile,
        "load_kind": first.load_kind,
        "sla_tps": float(sla_tps),
        "search_lo": float(lo),
        "search_hi": float(hi),
    }
    good_lo, at_lo = ok(lo)
    if not good_lo:
        row.update(max_load=math.nan, capped=False, probes=probes, feasible=False)
        return row
    good_hi, at_hi = ok(hi)
    if good_hi:
        row.update(max_load=float(hi), capped=True, probes=probes, feasible=True)
        row.update(_summary(at_hi))
        return row
    best, best_means = lo, at_lo
    a, b = lo, hi  # invariant: a feasible, b infeasible
    while (b - a > 1) if integer else (b - a > rel_tol * a):
        mid = (a + b) // 2 if integer else math.sqrt(a * b)  # geometric: loads span decades
        good, means = ok(mid)
        if good:
            a, best, best_means = mid, mid, means
        else:
            b = mid
    row.update(max_load=float(best), capped=False, probes=probes, feasible=True)
    row.update(_summary(best_means))
    return row


def _summary(means: dict[str, Any]) -> dict[str, Any]:
    skip = {"load", "concurrency", "rate", "replicate", "seed", "base_seed", "requests"}
    skip |= {"duration", "sla_tps"}
    return {k: v for k, v in means.items() if k not in skip}


class _Search(list):
    """One (trace, policy)'s cells, one search: run as the sweep runs its cells."""

    @property
    def key_hash(self) -> str:  # its Dask key
        return f"search-{self[0].key_hash}"


def find_max_load(
    traces: Any,
    policies: Any,
    *,
    sla_tps: float,
    concurrency: tuple[float, float] | list[float] | None = None,
    rates: tuple[float, float] | list[float] | None = None,
    seeds: int = 1,
    profile: str = "llama-3-8b-h100",
    seed: int = 0,
    requests: int | None = None,
    duration: float | None = None,
    workers: int | None = None,
    dask: Any = None,
    rel_tol: float = 0.02,
    progress: bool | None = None,
    **replay_options: Any,
) -> pd.DataFrame:
    """One row per (trace, policy): the highest load (between the min and max of the given
    ``concurrency`` or ``rates``) whose mean per-user speed meets ``sla_tps`` tok/s/user.

    ``max_load`` is NaN when even the lowest load misses the SLA; ``capped`` is True when the
    highest load still meets it (the true maximum lies beyond the range). Searches for different
    policies run in parallel (local processes or ``dask``); each search is sequential.
    """
    if not (sla_tps > 0 and math.isfinite(sla_tps)):
        raise SpecsimError(f"--sla-tps must be a positive number of tok/s/user, got {sla_tps}")
    loads = concurrency if concurrency is not None else rates
    if loads is None or concurrency is not None and rates is not None:
        raise SpecsimError("give exactly one of concurrency (--concurrency) or rates (--rates)")
    check_workers(workers)
    loads = [float(x) for x in loads]
    lo, hi = min(loads), max(loads)
    if not lo < hi:
        raise SpecsimError("the search needs a range: give at least two different loads")
    cells = build_cells(
        traces,
        policies,
        concurrency=[lo] if concurrency is not None else None,
        rates=[lo] if rates is not None else None,
        seeds=seeds,
        profile=profile,
        seed=seed,
        requests=requests,
        duration=duration,
        options=replay_options,
    )
    groups: dict[tuple[str, str], _Search] = {}
    for c in cells:
        groups.setdefault((c.trace, c.policy), _Search()).append(c)
    jobs = list(groups.values())
    search = functools.partial(search_one, sla_tps=sla_tps, lo=lo, hi=hi, rel_tol=rel_tol)
    found: dict[int, dict[str, Any]] = {}
    with Progress(len(jobs), "find-max-load", " policies", enabled=progress) as bar:
        for job, row in _execute(jobs, workers=workers, dask=dask, runner=search):
            found[id(job)] = row
            bar.update(1)
    rows = [found[id(job)] for job in jobs]  # in grid order, whichever finished first
    tally = Tally("searches")
    for row in rows:
        tally.add(row)
    tally.warn()
    return pd.DataFrame(rows)
