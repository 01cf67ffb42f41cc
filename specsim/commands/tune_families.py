"""``specsim tune --family ...``: the printing and ``--json`` of the drafter comparison.

The search and the ranking are :mod:`specsim.analysis.tune.families`; this module only says
what they found: a table per load (each family's pick, its objective, its paired difference to
the best family and to no speculation), the pick per band of loads, and the config to paste
for each band. Each family's own full table (every setting tune tried) is in ``--json``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any


def run_families(args: argparse.Namespace, cfg: Any, out: Path | None) -> int:
    """Tune every ``--family`` and print (or ``--json``) the comparison; ``--out``: the tidy
    table, one row per load x family."""
    from specsim.analysis.tune.families import tune_families
    from specsim.errors import SpecsimError
    from specsim.outputs import jsonable, write_table
    from specsim.progress import Progress

    if args.trtllm_cost_table is not None:
        raise SpecsimError("--trtllm-cost-table is TensorRT-LLM's file: drop it with --family")
    res = tune_families(args.family, cfg, lambda name: Progress(0, f"tune {name}", " replays"))
    for w in res.warnings:
        sys.stderr.write(f"specsim: warning: {w}\n")
    if out is not None:
        write_table(res.frame(), out)
    if args.json:
        print(json.dumps(jsonable(as_json(res)), sort_keys=True))
    else:
        print(report(res))
        if out is not None:
            print(f"table: {out}")
    return 0


def _config_json(ec: Any) -> dict[str, Any] | None:
    if ec is None:
        return None
    return {"kind": ec.kind, "text": ec.text, "data": ec.data, "notes": list(ec.notes)}


def as_json(res: Any) -> dict[str, Any]:
    """The ``--json`` object: the families, per load the rows (one per family) with the best,
    the ties, the recommended family and the verdict, the bands with their configs, and each
    family's own tune result (every setting it tried)."""
    from specsim.commands.tune import as_json as tune_json

    loads = [
        {
            "load_kind": fl.load.kind,
            "load": fl.load.value,
            "rows": fl.rows,
            "objective_by_seed": {r["family"]: x for r, x in zip(fl.rows, fl.samples, strict=True)},
            "best": None if fl.best is None else fl.rows[fl.best]["family"],
            "within_noise": [r["family"] for r in fl.rows if r["within_noise"]],
            "recommended": fl.recommended_row,
            "verdict": fl.verdict,
        }
        for fl in res.loads
    ]
    bands = [
        {"loads": [ld.value for ld in b.loads], "span": b.span(), "family": b.family,
         "setting": b.setting, "engine_config": _config_json(b.config)}
        for b in res.bands
    ]  # fmt: skip
    return {
        "mode": "families",
        "engine": res.config.engine,
        "families": [
            {
                "name": f.name,
                "method": f.method,
                "trace": f.trace,
                "profile": f.profile,
                "max_k": f.max_k,
            }
            for f in res.families
        ],  # fmt: skip
        "seeds": list(res.seeds),
        "objective": res.objective,
        "objective_text": res.objective_text,
        "sla": res.sla.describe(),
        "tie_rule": res.tie_rule,
        "none_source": res.none_source,
        "loads": loads,
        "bands": bands,
        "summary": summary_line(res),
        "one_for_all": None
        if res.one_for_all is None
        else {"family": res.one_for_all[0], "largest_shortfall_pct": res.one_for_all[1]},
        "notes": list(res.notes),
        "warnings": list(res.warnings),
        "config": res.config.as_dict(),
        "per_family": {
            name: tune_json(r, config_for=_renderer(res, name)) for name, r in res.results.items()
        },  # fmt: skip
    }


def _renderer(res: Any, name: str) -> Any:
    """A family's own config renderer, for its full tune table in ``--json``."""
    from specsim.analysis.tune.families import setting_config

    fam = next(f for f in res.families if f.name == name)
    return lambda r, row, lr: setting_config(row, fam, r, res.config.engine, lr.load)


def _fmt(x: Any, spec: str) -> str:
    return "n/a" if x is None or not math.isfinite(float(x)) else f"{x:{spec}}"


def _objective_head(res: Any) -> tuple[str, str]:
    """The objective column's title and number format."""
    if res.objective == "throughput":
        gpus = max(int(r.get("gpus", 1)) for fl in res.loads for r in fl.rows)
        return f"tok/s ({gpus} GPU{'s' if gpus > 1 else ''})", ",.0f"
    if res.objective == "goodput":
        return "goodput req/s", ".2f"
    return f"{res.objective.upper()} p{res.config.sla_quantile} ms", ".2f"


def table_text(res: Any, fl: Any) -> str:
    """One load's families as aligned columns; ``*`` marks the recommended family."""
    from specsim.analysis.tune.families import vs_none_text
    from specsim.analysis.tune.score import vs_best_text

    q = res.config.sla_quantile
    title, spec = _objective_head(res)
    head = ("", "family", "setting", title, "vs best", "vs none", "tau", "TPOT p50",
            f"TPOT p{q}", "SLA", "")  # fmt: skip
    body = []
    for r in fl.rows:
        mark = "best" if r["best"] else "within noise" if r["within_noise"] else ""
        body.append((
            "*" if r["recommended"] else "",
            r["family"],
            r["candidate"],
            _fmt(r["objective"], spec),
            "" if r["best"] else vs_best_text(r),
            "" if r["family"] == "none" else vs_none_text(r),
            _fmt(r["tau"], ".2f"),
            _fmt(r["tpot_ms_p50"], ".2f"),
            _fmt(r[f"tpot_ms_p{q}"], ".2f"),
            "yes" if r["sla_met"] else "no",
            mark,
        ))  # fmt: skip
    widths = [max(len(str(x[i])) for x in [head, *body]) for i in range(len(head))]
    left = {0, 1, 2, len(head) - 1}
    return "\n".join(
        "  ".join(str(c).ljust(w) if i in left else str(c).rjust(w)
                  for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()
        for cells in [head, *body]
    )  # fmt: skip


def summary_line(res: Any) -> str:
    """``per concurrency band: C 1-4: eagle3 k=3; C 16-64: dspark k=4 adaptive``."""
    kind = res.loads[0].load.kind if res.loads else "concurrency"
    what = {"concurrency": "concurrency band", "rate": "rate band"}.get(kind, "load")
    return f"per {what}: " + "; ".join(b.describe() for b in res.bands)


def _header(res: Any) -> list[str]:
    from specsim.analysis.tune.score import CONFIDENCE, TIE_SHARE

    cfg = res.config
    seeds = res.seeds
    lines = [
        f"specsim tune --family: {len(res.families)} families on "
        f"{'vLLM' if cfg.engine == 'vllm' else 'SGLang'}, each tuned as tune tunes one drafter, "
        "then ranked at each load",
    ]
    for f in (f for f in res.families if not f.is_none):
        src = f"trace {f.trace}, " if f.trace else ""
        what = f" ({f.method})" if f.method and f.method != f.name.lower() else ""
        cap = f", k up to {f.max_k} (the draft steps its profile prices)" if f.max_k else ""
        lines.append(f"  {f.name}{what}: {src}profile {f.profile}{cap}")
    lines += [
        f"  none: {res.none_source}",
        f"objective: {res.objective_text}, among settings meeting the SLA: {res.sla.describe()}",
        f"seeds: {seeds[0]}-{seeds[-1]}, the same for every setting of every family (common "
        "random numbers); every number is the mean over them",
        "setting: tune's pick for that family at that load (its full table: --json); vs best / "
        f"vs none: the paired difference to the best family / to no speculation, +- its "
        f"{100 * CONFIDENCE:g}% interval; within noise: the interval holds 0 or the difference "
        f"is under {100 * TIE_SHARE:g}%",
        f"tie rule: {res.tie_rule}",
    ]
    return lines + [f"note: {n}" for n in res.notes]


def report(res: Any) -> str:
    """The readable output: the families, a table and a verdict per load, the pick per band,
    and the config to paste for each band."""
    lines = _header(res)
    for fl in res.loads:
        lines += [
            "",
            f"== load: {fl.load.describe()} ==",
            table_text(res, fl),
            f"why: {fl.verdict}",
        ]
    lines += ["", summary_line(res)]
    if res.one_for_all is not None and len(res.bands) > 1:
        name, pct = res.one_for_all
        how = "the best at each" if pct == 0 else f"within {pct:.1f}% of the best family at each"
        lines.append(
            f"one deployment for every load above: {name} ({how} load; its setting per load is "
            "in the bands)"
        )
    for b in res.bands:
        if b.config is None:
            continue
        lines.append(f"config to paste for {b.describe()}:")
        lines += ["  " + x for x in b.config.text.splitlines()]
        lines += [f"  note: {n}" for n in b.config.notes]
    return "\n".join(lines)
