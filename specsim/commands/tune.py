"""``specsim tune``: your engine's best DSpark knobs at a load, and the config to paste.

specsim tune synthetic-chat --engine vllm --concurrency 64 --slo tpot=15 --profile v4-flash-8xh20
specsim tune traces/code.parquet --engine trtllm --concurrency 1,4,16,64 --profile v4-flash-8xh20
specsim tune my.parquet --engine llama --rate 4 --slo ttft=500,tpot=60 --json
specsim tune --engine vllm --concurrency 1,16,64 --family eagle3=e3.parquet@e3.csv \
    --family dspark=synthetic-chat@ds.csv --family none@none.csv   # which drafter, per load

Each setting of the engine's knobs is replayed at the load with the same --seeds seeds (common
random numbers), beside the engine's default and no speculation; the best meets the SLA and
maximises the objective's mean (see --objective), the settings whose paired difference to it is
within noise tie with it, and a stated rule picks the one to paste among them. The grid per
engine, the objective and the SLA rule: the docstring of specsim/analysis/tune/run.py; the ties and
the rule: specsim/analysis/tune/score.py. With --family (two or more drafters, each its trace
and built profile), each is tuned so and the picks are ranked per load:
specsim/analysis/tune/families.py, printed by specsim/commands/tune_families.py.
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
    from specsim.analysis.tune.run import ENGINES, TuneConfig
    from specsim.options import add_options

    p = sub.add_parser(
        "tune",
        help="search an engine's DSpark knobs (vLLM, TensorRT-LLM, SGLang, llama.cpp) at a load "
        "under an SLA and print the config to paste",
        description=__doc__.split("\n")[0],
    )
    p.add_argument(
        "trace", metavar="TRACE", nargs="?",
        help="trace file (.parquet) or a shipped trace name (chat, ...); or --family",
    )  # fmt: skip
    p.add_argument(
        "--family", action="append", metavar="NAME=TRACE@PROFILE",
        help="instead of TRACE and --profile, two or more times: a drafter family (dspark, "
        "eagle, eagle3, mtp, ngram, dflash or a label), its trace and its built profile; "
        "none@PROFILE: no speculation. Each is tuned, then they are ranked per load",
    )  # fmt: skip
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
    p.set_defaults(profile=None)  # None: not given (--family refuses it), else the default
    add_seed(p, "random seed: the replays use seeds --seed x --seeds .. + --seeds - 1, the same "
             "for every setting")  # fmt: skip
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
    from specsim.analysis.tune.run import TuneConfig
    from specsim.options import from_args

    conc = rate = None
    if args.concurrency is not None:  # whole numbers as int, so an error shows what was typed
        conc = tuple(
            int(x) if x.is_integer() else x
            for x in parse_numbers(args.concurrency, "--concurrency")
        )
    if args.rate is not None:
        rate = tuple(parse_numbers(args.rate, "--rate"))
    from specsim.sim.config import default

    return from_args(TuneConfig, args, concurrency=conc, rate=rate, cv=resolve_cv(args),
                     profile=args.profile or default("profile"))  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from specsim.outputs import check_out, claim

    _one_mode(args)
    cfg = config_from_args(args)
    if args.family:
        from specsim.commands.tune_families import run_families

        with claim(args.out, force=args.force) as out:
            return run_families(args, cfg, out)
    table_path = None
    if args.trtllm_cost_table is not None:  # checked before the work; locked when written
        table_path = check_out(
            args.trtllm_cost_table, force=args.force, suffixes=(".json",),
            flag="--trtllm-cost-table",
        )  # fmt: skip
    with claim(args.out, force=args.force) as out:  # checked and locked before the work
        return _run(args, cfg, out, table_path)


def _one_mode(args: argparse.Namespace) -> None:
    """TRACE (and --profile) for one drafter, or --family for several: one of the two."""
    from specsim.errors import SpecsimError

    if args.family and (args.trace is not None or args.profile is not None):
        given = " and ".join(x for x, v in (("TRACE", args.trace), ("--profile", args.profile))
                             if v is not None)  # fmt: skip
        raise SpecsimError(
            f"--family carries each drafter's trace and profile: drop {given}, or drop --family "
            "to tune one drafter"
        )
    if not args.family and args.trace is None:
        raise SpecsimError(
            "give TRACE (one drafter: specsim tune TRACE --engine E --profile P ...) or two "
            "or more --family NAME=TRACE@PROFILE"
        )


def _run(args: argparse.Namespace, cfg: Any, out: Path | None, table_path: Path | None) -> int:
    from specsim.analysis.tune.run import tune
    from specsim.errors import SpecsimError
    from specsim.outputs import jsonable, write_table
    from specsim.progress import Progress

    if table_path is not None and cfg.engine != "trtllm":
        raise SpecsimError(
            "--trtllm-cost-table is TensorRT-LLM's file: use it with --engine trtllm"
        )
    from specsim.analysis.tune.spread import check_spread, spread_rows, spread_text

    check_spread(cfg.spread)  # before the search: a typo costs no minutes
    with Progress(0, "tune", " replays") as bar:
        res = tune(args.trace, cfg, progress=bar)
    spread = spread_rows(args.trace, res)
    acceptance = res.acceptance.get("warning")
    for w in dict.fromkeys([*([acceptance] if acceptance else []),
                            *(w for lr in res.loads for w in lr.warnings)]):  # fmt: skip
        sys.stderr.write(f"specsim: warning: {w}\n")
    cost_table = str(table_path) if table_path is not None else None
    if table_path is not None:
        _write_cost_table(cfg.profile, table_path, args.force)
    if out is not None:
        write_table(res.frame(), out)
    if args.json:
        obj = as_json(res, cost_table)
        if spread:
            obj["spread"] = spread
        print(json.dumps(jsonable(obj), sort_keys=True))
    else:
        print("\n".join([report(res, cost_table), *spread_text(spread)]))
        if out is not None:
            print(f"table: {out}")
    return 0


def _write_cost_table(profile: str, path: Path, force: bool) -> None:
    """TensorRT-LLM's confidence cost table of ``profile`` (``specsim profile export
    --format trtllm``), locked and written atomically by the exporter."""
    from specsim.sim.cost.profile_export import to_trtllm
    from specsim.sim.cost.profiles import get_profile

    to_trtllm(get_profile(profile), path, force=force)


def _config_for(res: Any, row: dict | None, cost_table: str | None, lr: Any = None):  # noqa: ANN202
    from specsim.analysis.tune.configs import render

    if row is None:
        return None
    pool = (lr.candidates if lr is not None and lr.candidates else None) or res.candidates
    cand = next(c for c in pool if c.label == row["candidate"])
    return render(
        res.config.engine,
        cand.knob_dict(),
        block=res.block,
        drafter=res.config.drafter,
        cost_table=cost_table,
    )


def as_json(res: Any, cost_table: str | None = None, config_for: Any = None) -> dict[str, Any]:
    """The ``--json`` object: what was searched and scored, and per load the rows, the best, the
    settings within noise of it, the recommended one (by the tie rule), the default, no
    speculation, the verdict and the config to paste (the recommended setting's; ``config_for``
    ``(res, row, lr) -> EngineConfig`` renders it for a drafter other than DSpark)."""
    loads = []
    for lr in res.loads:
        row = lr.recommended_row
        ec = (config_for(res, row, lr) if config_for and row else
              _config_for(res, row, cost_table, lr))  # fmt: skip
        loads.append(
            {
                "load_kind": lr.load.kind,
                "load": lr.load.value,
                "rows": lr.rows,
                "objective_by_seed": {
                    r["candidate"]: x for r, x in zip(lr.rows, lr.samples, strict=True)
                },
                "best": lr.best_row,
                "within_noise": [r["candidate"] for r in lr.rows if r["within_noise"]],
                "recommended": lr.recommended_row,
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
        "gpus": res.gpus,
        "throughput_unit": "output tok/s of the whole deployment (all its gpus); "
        "throughput_per_gpu_tok_s: per GPU",
        "block_size": res.block,
        "seeds": list(res.seeds),
        "objective": res.objective,
        "objective_text": res.objective_text,
        "sla": res.sla.describe(),
        "tie_rule": res.tie_rule,
        "acceptance": res.acceptance,
        "acceptance_warning": res.acceptance.get("warning"),
        "notes": list(res.notes),
        "config": res.config.as_dict(),
        "loads": loads,
        "draft_len_schedule": res.extra.get("draft_len_schedule"),
    }


def _fmt(x: Any, spec: str) -> str:
    return "n/a" if x is None or not math.isfinite(float(x)) else f"{x:{spec}}"


def vs_best_text(r: dict) -> str:
    from specsim.analysis.tune.score import vs_best_text as text

    return text(r)


def _sla_cell(r: dict) -> str:
    """``yes`` / ``no`` on the seeds' mean, with how many seeds met it where they disagree."""
    k, n = r.get("sla_seeds_met", 0), r.get("seeds", 1)
    return ("yes" if r["sla_met"] else "no") + (f" {k}/{n}" if 0 < k < n else "")


def table_text(rows: list[dict], q: int, gpus: int = 1) -> str:
    """The candidates as aligned columns; ``*`` marks the recommended setting, the last column
    the best (highest mean) and those within noise of it; the default says so."""
    head = ("", "setting", f"tok/s ({gpus} GPU{'s' if gpus > 1 else ''})", "tok/s/GPU",
            "vs best", "TPOT p50", f"TPOT p{q}", f"TTFT p{q}", "tau", "SLA", "")  # fmt: skip
    body = []
    for r in rows:
        name = r["candidate"] + (" (default)" if r["role"] == "default" else "")
        body.append((
            "*" if r.get("recommended") else "",
            name,
            _fmt(r["throughput_tok_s"], ",.0f"),
            _fmt(r["throughput_tok_s"] / gpus, ",.0f"),
            "" if r.get("best") else vs_best_text(r),
            _fmt(r["tpot_ms_p50"], ".2f"),
            _fmt(r[f"tpot_ms_p{q}"], ".2f"),
            _fmt(r[f"ttft_ms_p{q}"], ".1f"),
            _fmt(r["tau"], ".2f"),
            _sla_cell(r),
            "best" if r.get("best") else "within noise" if r.get("within_noise") else "",
        ))  # fmt: skip
    if gpus <= 1:  # the per-GPU column would repeat the first
        head, body = head[:3] + head[4:], [b[:3] + b[4:] for b in body]
    widths = [max(len(str(x[i])) for x in [head, *body]) for i in range(len(head))]
    left = {0, 1, len(head) - 1}

    def line(cells: tuple) -> str:
        return "  ".join(
            str(c).ljust(w) if i in left else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([line(head), *(line(b) for b in body)])


def _seeds_text(res: Any) -> str:
    from specsim.analysis.tune.score import TIE_SHARE

    seeds, cfg = res.seeds, res.config
    shown = f"{seeds[0]}" if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]}"
    if len(seeds) == 1:
        return (
            f"seed: {shown} (--seeds 1: one replay per setting, no interval; differences under "
            f"{100 * TIE_SHARE:g}% are ties)"
        )
    return (
        f"seeds: {shown} (--seed {cfg.seed} x --seeds {len(seeds)}), the same for every setting "
        "(common random numbers); every number is the mean over them"
    )


def report(res: Any, cost_table: str | None = None) -> str:
    """The readable output: what was searched, then per load the table, the best, the settings
    within noise of it, the recommendation and why, and the config to paste."""
    from specsim.analysis.tune.configs import ENGINE_NAMES
    from specsim.analysis.tune.score import CONFIDENCE, TIE_SHARE

    cfg = res.config
    name = ENGINE_NAMES[cfg.engine]
    gpus = res.gpus
    tau = res.acceptance.get("trace_tau")
    lines = [
        f"specsim tune: {name} on {res.trace} (block {res.block}"
        + (f", tau {tau:.2f}" if tau is not None and math.isfinite(tau) else "")
        + f"), profile {res.profile} ({gpus} GPU{'s' if gpus > 1 else ''})"
        + (
            f", FITTED on your baseline ({res.extra['fit_residual']})"
            if res.extra.get("fit_residual")
            else ""
        ),  # fmt: skip
        f"objective: {res.objective_text}, among settings meeting the SLA: {res.sla.describe()}",
        _seeds_text(res),
        f"tok/s: output tokens/s of the whole deployment (the profile's {gpus} "
        f"GPU{'s' if gpus > 1 else ''} together)"
        + ("; tok/s/GPU: the same per GPU" if gpus > 1 else ""),
        f"vs best: the objective's paired difference to the best, +- its "
        f"{100 * CONFIDENCE:g}% interval over the seeds; within noise: the interval holds 0 "
        f"or the difference is under {100 * TIE_SHARE:g}%",
        f"tie rule: {res.tie_rule}",
    ]
    if cfg.closed:
        lines.append(
            "note: closed loop: the first C requests arrive at t=0 and are prefilled together, "
            "so TTFT percentiles can coincide; use --rate for the TTFT a user meets"
        )
    lines += [f"note: {n}" for n in res.notes]
    if res.acceptance.get("warning"):
        lines.append(
            f"note: the trace's tau {tau:.2f} is far from this profile's deployment "
            "(see the warning on stderr): the answer is for the trace's drafter"
        )
    for lr in res.loads:
        table = table_text(lr.rows, cfg.sla_quantile, gpus)
        lines += ["", f"== load: {lr.load.describe()} ==", table]
        best, rec = lr.best_row, lr.recommended_row
        if best is None or rec is None:
            lines += ["best: none meets the SLA", f"why: {lr.verdict}"]
            continue
        lines.append(f"best: {best['candidate']} ({best['knobs']}), the highest mean")
        ties = [r["candidate"] for r in lr.rows if r["within_noise"]]
        lines.append(f"within noise of it: {', '.join(ties) if ties else 'none'}")
        how = "the best" if rec is best else "by the tie rule"
        lines.append(f"recommended: {rec['candidate']} ({rec['knobs']}), {how}")
        lines.append(f"why: {lr.verdict}")
        anchor = _anchored(res, lr, rec)
        if anchor:
            lines.append(anchor)
        ec = _config_for(res, rec, cost_table, lr)
        lines.append(f"config to paste ({name}):")
        lines += ["  " + x for x in ec.text.splitlines()]
        lines += [f"  note: {n}" for n in ec.notes]
    return "\n".join(lines + _across_loads(res, cost_table))


def _anchored(res: Any, lr: Any, rec: dict) -> str:
    """On a profile fitted to the operator's runs, at a concurrency they measured: the
    recommended setting's throughput anchored on their measured no-speculation run (the
    predicted gain over the predicted no-speculation row, applied to the measurement)."""
    base = res.extra.get("baseline_tok_s") or {}
    if lr.load.kind != "concurrency" or int(lr.load.value) not in base:
        return ""
    measured = base[int(lr.load.value)]
    nospec = lr.rows[lr.no_spec]["throughput_tok_s"]
    if not (nospec and math.isfinite(nospec)):
        return ""
    gain = rec["throughput_tok_s"] / nospec
    return (
        f"your baseline at {int(lr.load.value)} in flight: {measured:,.0f} tok/s measured without "
        f"speculation ({nospec:,.0f} predicted, {100 * (nospec / measured - 1):+.1f}%); "
        f"{rec['candidate']} predicts x{gain:.3f} over it: {measured * gain:,.0f} tok/s"
    )


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
    if res.objective == "throughput" and res.gpus > 1:
        unit += f" over {res.gpus} GPUs"
    row = None
    for lr in res.loads:
        row, best = _schedule_row(lr), lr.best_row
        if row is None or best is None:
            continue
        lines.append(
            f"{lr.load.describe()}: {_fmt(row['objective'], spec)} {unit} against the load's "
            f"best {_fmt(best['objective'], spec)} {unit} ({vs_best_text(row)}), SLA "
            f"{'met' if row['sla_met'] else 'missed'}"
        )
    if row is not None:
        ec = _config_for(res, row, cost_table)
        lines.append(
            "one config for every load above (at each load the best fixed draft length, for "
            "batch sizes up to it; speculation off above the largest):"
        )
        lines += ["  " + x for x in ec.text.splitlines()]
        lines += [f"  note: {n}" for n in ec.notes]
    return lines
