"""``specsim tune``: your engine's best DSpark knobs at a load, and the config to paste.

specsim tune chat --engine vllm --concurrency 64 --slo tpot=10
specsim tune traces/code.parquet --engine trtllm --concurrency 1,4,16,64 --profile v4-flash-like
specsim tune my.parquet --engine llama --rate 4 --slo ttft=500,tpot=60 --json

Each setting of the engine's knobs is replayed once at the load with the same seed (common
random numbers), beside the engine's default and no speculation; the best meets the SLA and
maximises the objective (see --objective). The grid per engine, the objective and the SLA rule:
the docstring of specsim/analysis/tune.py.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from specsim.commands.common import add_burstiness, add_profile, add_seed, resolve_cv


def register(sub: argparse._SubParsersAction) -> None:
    from specsim.analysis.tune import ENGINES, TuneConfig
    from specsim.options import add_options

    p = sub.add_parser(
        "tune",
        help="search an engine's DSpark knobs (vLLM, TensorRT-LLM, SGLang, llama.cpp) at a load "
        "under an SLA and print the config to paste",
        description=__doc__.split("\n")[0],
    )
    p.add_argument(
        "trace", metavar="TRACE", help="trace file (.parquet) or a shipped trace name (chat, ...)"
    )
    p.add_argument("--engine", required=True, choices=ENGINES, help="the engine you deploy")
    load = p.add_mutually_exclusive_group(required=True)
    load.add_argument(
        "--concurrency",
        help="closed loop: requests in flight, or a list (1,4,16,64): one search each",
    )
    load.add_argument("--rate", help="open loop: Poisson arrivals, requests/s, or a list")
    load.add_argument("--arrivals", metavar="CSV", help="arrival times (Azure CSV, azure-conv)")
    add_burstiness(p)
    add_profile(p)
    add_seed(p, "random seed, the same for every setting")
    add_options(p, TuneConfig, skip=("engine",))
    p.add_argument(
        "--trtllm-cost-table",
        metavar="FILE.json",
        help="trtllm: also write TensorRT-LLM's confidence cost table for the profile here "
        "(the file confidence_cost_table_path names)",
    )
    p.add_argument("--out", metavar="FILE", help="write the table (.csv, .parquet or .json)")
    p.add_argument("--force", action="store_true", help="overwrite --out / --trtllm-cost-table")
    p.add_argument("--json", action="store_true", help="print one JSON object (table + config)")
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace):  # noqa: ANN201 - TuneConfig
    """The TuneConfig of the parsed flags (loads parsed as sweep parses them)."""
    from specsim.analysis.grid import parse_numbers
    from specsim.analysis.tune import TuneConfig
    from specsim.options import from_args

    conc = rate = None
    if args.concurrency is not None:  # whole numbers as int, so an error shows what was typed
        conc = tuple(
            int(x) if x.is_integer() else x
            for x in parse_numbers(args.concurrency, "--concurrency")
        )
    if args.rate is not None:
        rate = tuple(parse_numbers(args.rate, "--rate"))
    return from_args(TuneConfig, args, concurrency=conc, rate=rate, cv=resolve_cv(args))


def run(args: argparse.Namespace) -> int:
    from specsim.outputs import check_out, claim

    cfg = config_from_args(args)
    table_path = None
    if args.trtllm_cost_table is not None:  # checked before the work; locked when written
        table_path = check_out(
            args.trtllm_cost_table, force=args.force, suffixes=(".json",),
            flag="--trtllm-cost-table",
        )  # fmt: skip
    with claim(args.out, force=args.force) as out:  # checked and locked before the work
        return _run(args, cfg, out, table_path)


def _run(args: argparse.Namespace, cfg: Any, out: Path | None, table_path: Path | None) -> int:
    from specsim.analysis.tune import tune
    from specsim.errors import SpecsimError
    from specsim.outputs import jsonable, write_table
    from specsim.progress import Progress

    if table_path is not None and cfg.engine != "trtllm":
        raise SpecsimError(
            "--trtllm-cost-table is TensorRT-LLM's file: use it with --engine trtllm"
        )
    with Progress(0, "tune", " replays") as bar:
        res = tune(args.trace, cfg, progress=bar)
    for w in dict.fromkeys(w for lr in res.loads for w in lr.warnings):
        sys.stderr.write(f"specsim: warning: {w}\n")
    cost_table = str(table_path) if table_path is not None else None
    if table_path is not None:
        _write_cost_table(cfg.profile, table_path, args.force)
    if out is not None:
        write_table(res.frame(), out)
    if args.json:
        print(json.dumps(jsonable(as_json(res, cost_table)), sort_keys=True))
    else:
        print(report(res, cost_table))
        if out is not None:
            print(f"table: {out}")
    return 0


def _write_cost_table(profile: str, path: Path, force: bool) -> None:
    """TensorRT-LLM's confidence cost table of ``profile`` (``specsim profile export
    --format trtllm``), locked and written atomically by the exporter."""
    from specsim.sim.cost_profiles import get_profile
    from specsim.sim.profile_export import to_trtllm

    to_trtllm(get_profile(profile), path, force=force)


def _config_for(res: Any, row: dict | None, cost_table: str | None):  # noqa: ANN202
    from specsim.analysis.engine_configs import render

    if row is None:
        return None
    cand = next(c for c in res.candidates if c.label == row["candidate"])
    return render(
        res.config.engine,
        cand.knob_dict(),
        block=res.block,
        drafter=res.config.drafter,
        cost_table=cost_table,
    )


def as_json(res: Any, cost_table: str | None = None) -> dict[str, Any]:
    """The ``--json`` object: what was searched and scored, and per load the rows, the best,
    the default, no speculation, the verdict and the config to paste."""
    loads = []
    for lr in res.loads:
        ec = _config_for(res, lr.best_row, cost_table)
        loads.append(
            {
                "load_kind": lr.load.kind,
                "load": lr.load.value,
                "rows": lr.rows,
                "best": lr.best_row,
                "default": lr.rows[lr.default],
                "no_speculation": lr.rows[lr.no_spec],
                "verdict": lr.verdict,
                "engine_config": None
                if ec is None
                else {"kind": ec.kind, "text": ec.text, "data": ec.data, "notes": list(ec.notes)},
            }
        )
    return {
        "engine": res.config.engine,
        "trace": res.trace,
        "profile": res.profile,
        "block_size": res.block,
        "objective": res.objective,
        "objective_text": res.objective_text,
        "sla": res.sla.describe(),
        "config": res.config.as_dict(),
        "loads": loads,
        "draft_len_schedule": res.extra.get("draft_len_schedule"),
    }


def _fmt(x: Any, spec: str) -> str:
    return "n/a" if x is None or not math.isfinite(float(x)) else f"{x:{spec}}"


def table_text(rows: list[dict], q: int) -> str:
    """The candidates as aligned columns; ``*`` marks the best, the default says so."""
    head = ("", "setting", "tok/s", "TPOT p50", f"TPOT p{q}", f"TTFT p{q}", "tau", "SLA")
    body = []
    for r in rows:
        name = r["candidate"] + (" (default)" if r["role"] == "default" else "")
        body.append((
            "*" if r["best"] else "",
            name,
            _fmt(r["throughput_tok_s"], ",.0f"),
            _fmt(r["tpot_ms_p50"], ".2f"),
            _fmt(r[f"tpot_ms_p{q}"], ".2f"),
            _fmt(r[f"ttft_ms_p{q}"], ".1f"),
            _fmt(r["tau"], ".2f"),
            "yes" if r["sla_met"] else "no",
        ))  # fmt: skip
    widths = [max(len(str(x[i])) for x in [head, *body]) for i in range(len(head))]
    left = {0, 1}

    def line(cells: tuple) -> str:
        return "  ".join(
            str(c).ljust(w) if i in left else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([line(head), *(line(b) for b in body)])


def report(res: Any, cost_table: str | None = None) -> str:
    """The readable output: per load the table, the best, the verdict, the config to paste."""
    from specsim.analysis.engine_configs import ENGINE_NAMES

    cfg = res.config
    name = ENGINE_NAMES[cfg.engine]
    lines = [
        f"specsim tune: {name} on {res.trace} (block {res.block}), profile {res.profile}, "
        f"seed {cfg.seed}",
        f"objective: {res.objective_text}, among settings meeting the SLA: {res.sla.describe()}",
        "(predicted: each setting replayed once, same seed; latencies in ms)",
    ]
    if cfg.closed:
        lines.append(
            "note: closed loop: the first C requests arrive at t=0 and are prefilled together, "
            "so TTFT percentiles can coincide; use --rate for the TTFT a user meets"
        )
    for lr in res.loads:
        lines += ["", f"== load: {lr.load.describe()} ==", table_text(lr.rows, cfg.sla_quantile)]
        best = lr.best_row
        if best is None:
            lines += ["best: none meets the SLA", f"why: {lr.verdict}"]
            continue
        lines.append(f"best: {best['candidate']} ({best['knobs']})")
        lines.append(f"why: {lr.verdict}")
        ec = _config_for(res, best, cost_table)
        lines.append(f"config to paste ({name}):")
        lines += ["  " + x for x in ec.text.splitlines()]
        lines += [f"  note: {n}" for n in ec.notes]
    return "\n".join(lines + _across_loads(res, cost_table))


def _objective_format(objective: str) -> tuple[str, str]:
    """(format spec, unit) of an objective's number."""
    return {"throughput": (",.0f", "tok/s"), "goodput": (".2f", "req/s")}.get(
        objective, (".2f", "ms")
    )


def _schedule_row(lr: Any) -> dict | None:
    return next((r for r in lr.rows if "tuned across" in r["candidate"]), None)


def _across_loads(res: Any, cost_table: str | None) -> list[str]:
    """TensorRT-LLM over several loads: one ``draft_len_schedule`` for all of them, and what it
    gives up at each load against that load's own best."""
    if not res.extra.get("draft_len_schedule"):
        return []
    lines = ["", "== across these loads (TensorRT-LLM draft_len_schedule) =="]
    spec, unit = _objective_format(res.objective)
    row = None
    for lr in res.loads:
        row, best = _schedule_row(lr), lr.best_row
        if row is None or best is None:
            continue
        gap = 100.0 * (row["objective"] - best["objective"]) / abs(best["objective"] or 1.0)
        lines.append(
            f"{lr.load.describe()}: {_fmt(row['objective'], spec)} {unit} against the load's "
            f"best {_fmt(best['objective'], spec)} {unit} ({gap:+.1f}%), SLA "
            f"{'met' if row['sla_met'] else 'missed'}"
        )
    if row is not None:
        ec = _config_for(res, row, cost_table)
        lines.append(
            "one config for every load above (at each load the best fixed draft length, for "
            "batch sizes up to it; speculation off above the largest):"
        )
        lines += ["  " + x for x in ec.text.splitlines()]
    return lines
