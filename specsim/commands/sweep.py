"""``specsim sweep``: replay a grid of traces x policies x loads x seeds in parallel.

    specsim sweep traces/chat.parquet --policies mtp1,hw-aware,zos \\
        --concurrency 1,2,4,...,256 --seeds 3 --profile v4-flash-8xh20 --out results.parquet

Local processes by default, or ``--dask tcp://host:port`` for an existing Dask cluster.
Resumable: re-run the same command after an interruption and only missing cells run.
``--find-max-rate --sla-tps X`` instead bisects, per policy, the highest load (within the range
of --rates or --concurrency) whose mean per-user speed is at least X tok/s/user.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specsim.commands.common import (
    POLICY_HELP,
    add_burstiness,
    add_profile,
    add_seed,
    plain_warnings,
    resolve_cv,
)
from specsim.errors import SpecsimError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep",
        help="replay a grid of policies x loads x seeds in parallel (local or Dask)",
        description=__doc__.split("\n")[0],
    )
    p.add_argument("traces", nargs="+", metavar="TRACE", help="trace files (.parquet)")
    p.add_argument(
        "--policies",
        "--policy",
        dest="policies",
        required=True,
        help="comma-separated, e.g. mtp1,hw-aware,zos; each one of: " + POLICY_HELP,
    )
    load = p.add_mutually_exclusive_group()
    load.add_argument("--concurrency", help="requests in flight (closed loop), e.g. 1,2,4,...,256")
    load.add_argument(
        "--rates", "--rate", dest="rates", help="arrival rates in req/s (open loop), e.g. 1,2,4,8"
    )
    p.add_argument("--seeds", type=int, default=1, help="seed replicates per cell (default 1)")
    add_seed(p, "base seed")
    add_profile(p)
    p.add_argument("--requests", type=int, default=None, help="requests per replay")
    p.add_argument("--duration", type=float, default=None, help="simulated seconds per replay")
    p.add_argument("--sla-tps", type=float, default=None, help="per-user SLA (tok/s/user)")
    add_burstiness(p)
    load.add_argument(
        "--arrivals",
        default=None,
        help="replay these arrival times (a CSV or azure-conv / azure-code) instead of a load grid",
    )
    p.add_argument("--out", required=True, help="results table (.parquet)")
    p.add_argument("--workers", type=int, default=None, help="local processes (default: CPUs)")
    p.add_argument("--dask", default=None, metavar="ADDR", help="Dask scheduler tcp://host:port")
    p.add_argument("--force", action="store_true", help="replace --out instead of resuming it")
    p.add_argument(
        "--find-max-rate",
        action="store_true",
        help="bisect the highest load per policy meeting --sla-tps (range: min..max of the loads)",
    )
    p.add_argument(
        "--allow-unsteady",
        dest="require_steady",
        action="store_false",
        default=True,  # the command refuses; sweep() itself warns (ReplayConfig)
        help="run closed loops too short for a steady window (their steady metrics NaN)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with plain_warnings():  # a cell's warning: one line, with how many cells said it
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from specsim.analysis.grid import parse_numbers
    from specsim.options import split_items

    policies = split_items(args.policies, "--policies")
    conc = parse_numbers(args.concurrency, "--concurrency") if args.concurrency else None
    rates = parse_numbers(args.rates, "--rates") if args.rates else None
    opts = {"sla_tps": args.sla_tps, "cv": resolve_cv(args), "arrivals": args.arrivals}
    if conc and not args.find_max_rate:  # the closed-loop rule (sim.workload), refusing
        opts["require_steady"] = args.require_steady
    common = dict(
        concurrency=conc,
        rates=rates,
        seeds=args.seeds,
        profile=args.profile,
        seed=args.seed,
        requests=args.requests,
        duration=args.duration,
        workers=args.workers,
        dask=args.dask,
    )
    out = Path(args.out)
    if args.find_max_rate:
        if args.sla_tps is None:
            raise SpecsimError("--find-max-rate needs --sla-tps X (tok/s/user)")
        from specsim.analysis.maxload import find_max_load
        from specsim.outputs import claim, write_table

        opts.pop("sla_tps")
        with claim(out, force=args.force, suffixes=(".parquet",)):
            table = find_max_load(args.traces, policies, sla_tps=args.sla_tps, **common, **opts)
            write_table(table, out)
        cols = ["trace", "policy", "max_load", "capped", "probes"]
        print(table[cols].to_string(index=False))
        print(f"wrote {out}", file=sys.stderr)
        return 0
    from specsim.analysis.sweep import sweep

    table = sweep(args.traces, policies, out=out, force=args.force, **common, **opts)
    a = table.attrs
    print(
        f"wrote {out}: {a['cells_total']} cells ({a['cells_run']} run, "
        f"{a['cells_reused']} already done)",
        file=sys.stderr,
    )
    return 0
