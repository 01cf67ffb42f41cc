"""``specsim replay``: replay a trace through the simulated server under a policy and a load.

specsim replay traces/synthetic-chat.parquet --policy hw-aware --concurrency 64
specsim replay my.parquet --policy zos --arrivals azure-conv --requests 2000 --json
specsim replay my.parquet --policy mtp1 --rate 20 --cv 3 --profile v4-flash-like --sla-tps 80
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import warnings

from specsim.commands.common import (
    POLICY_HELP,
    add_burstiness,
    add_profile,
    add_seed,
    resolve_cv,
)
from specsim.errors import SpecsimError
from specsim.outputs import check_out, jsonable, write_table


def register(sub: argparse._SubParsersAction) -> None:
    from specsim.sim.config import default, flag_help

    p = sub.add_parser(
        "replay",
        help="replay a trace in the serving simulator under a policy and a load",
        description=__doc__.split("\n")[0],
    )
    p.add_argument("trace", metavar="TRACE", help="trace file (.parquet)")
    p.add_argument("--policy", default="hw-aware", help=POLICY_HELP + " (default: hw-aware)")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--rate", type=float, help=flag_help("rate"))
    load.add_argument("--concurrency", type=int, help=flag_help("concurrency"))
    load.add_argument("--arrivals", metavar="CSV", help=flag_help("arrivals"))
    add_burstiness(p)
    bound = p.add_mutually_exclusive_group()
    bound.add_argument("--requests", type=int, help=flag_help("requests"))
    bound.add_argument("--duration", type=float, help=flag_help("duration"))
    add_profile(p)
    add_seed(p)
    p.add_argument("--sla-tps", type=float, help=flag_help("sla_tps"))
    p.add_argument("--slo", metavar="ttft=MS,tpot=MS", help=flag_help("slo"))
    p.add_argument("--calibrate", choices=["sts"], help=flag_help("calibrate"))
    for name in ("max_running", "kv_tokens", "prefill_budget", "max_batched_tokens", "kv_block"):
        p.add_argument("--" + name.replace("_", "-"), type=int, help=flag_help(name))
    p.add_argument("--serving", choices=("v2", "v1"), default=default("serving"),
                   help=flag_help("serving"))  # fmt: skip
    p.add_argument("--kv", choices=("paged", "reserve"), default=default("kv"),
                   help=flag_help("kv"))  # fmt: skip
    p.add_argument(
        "--allow-unsteady",
        dest="require_steady",
        action="store_false",
        default=True,  # the command refuses; replay() itself warns (ReplayConfig)
        help="run a closed loop too short for a steady window (steady metrics NaN)",
    )
    p.add_argument("--out", metavar="FILE", help="write the per-request table (.parquet)")
    p.add_argument("--force", action="store_true", help="overwrite --out")
    p.add_argument("--json", action="store_true", help="print one JSON object (summary+config)")
    p.set_defaults(func=run)


def _fmt(x: float, spec: str = ".1f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:{spec}}"


def _pcts(s: dict, name: str, spec: str) -> str:
    return " / ".join(_fmt(s[f"{name}_ms_p{q}"], spec) for q in (50, 90, 99)) + " ms"


def table(summary: dict, config: dict) -> str:
    """The readable report: one line per quantity."""
    s = summary
    rows = [
        ("policy", f"{config['policy']}" + (" (ZOS)" if config["zos"] else "")),
        ("load", config["load"]),
        ("profile", config["profile"]),
        ("requests completed", f"{s['requests_completed']:,}"),
        ("simulated time", f"{_fmt(s['sim_time_s'], '.2f')} s"),
        ("throughput", f"{_fmt(s['throughput_tok_s'], ',.0f')} tok/s"),
        *(
            [("steady-state throughput", f"{_fmt(s['steady_throughput_tok_s'], ',.0f')} tok/s")]
            if math.isfinite(s["steady_throughput_tok_s"])
            else []
        ),
        ("per-user speed", f"{_fmt(s['per_user_tps_mean'])} tok/s (mean)"),
        ("achieved concurrency", _fmt(s["achieved_concurrency"], ".1f")),
        ("request throughput", f"{_fmt(s['request_throughput'], '.2f')} req/s"),
        ("TTFT p50 / p90 / p99", _pcts(s, "ttft", ".1f")),
        ("TPOT p50 / p90 / p99", _pcts(s, "tpot", ".2f")),
        ("ITL p50 / p90 / p99", _pcts(s, "itl", ".2f")),
        (
            "ITL p99.9 / max",
            f"{_fmt(s.get('itl_ms_p99.9'), '.2f')} / {_fmt(s.get('itl_ms_max'), '.2f')} ms",
        ),
        ("E2E p50 / p90 / p99", _pcts(s, "e2e", ",.0f")),
        ("tau (tokens/step)", _fmt(s["tau"], ".3f")),
        ("verify efficiency", _fmt(s["verify_efficiency"], ".3f")),
        ("mean batch", f"{_fmt(s['mean_batch_tokens'])} tokens"),
    ]
    if s.get("preemptions"):
        rows.append(("preemptions", f"{s['preemptions']:,} ({s['recomputed_tokens']:,} tokens "
                                    "recomputed)"))  # fmt: skip
    if config.get("slo_ms"):
        slo = ", ".join(f"{k} <= {v:g} ms" for k, v in config["slo_ms"].items())
        rows.append(
            (
                "goodput",
                f"{_fmt(s['goodput_req_s'], '.2f')} req/s meet {slo} "
                f"({_fmt(100 * s['slo_attainment'])}%)",
            )
        )
    if config.get("sla_tps") is not None:
        rows.append(
            (
                f"SLA >= {config['sla_tps']:g} tok/s",
                f"{_fmt(100 * s['sla_attainment'])}% of requests",
            )
        )
    rows.append(("wall time", f"{_fmt(s['wall_time_s'], '.2f')} s"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def run(args: argparse.Namespace) -> int:
    from specsim.progress import Progress
    from specsim.sim.simulate import replay

    out = None if args.out is None else check_out(args.out, force=args.force)
    cv = resolve_cv(args)
    if not os.path.isfile(args.trace):
        what = "is a directory" if os.path.isdir(args.trace) else "does not exist"
        raise SpecsimError(f"trace file {args.trace!r} {what}; give a .parquet trace")
    from specsim.trace.io import read_trace

    trace = read_trace(args.trace)
    total = args.requests or 0
    with Progress(total, "replay", " req") as bar, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = replay(
            trace,
            args.policy,
            rate=args.rate,
            concurrency=args.concurrency,
            arrivals=args.arrivals,
            cv=cv,
            requests=args.requests,
            duration=args.duration,
            profile=args.profile,
            seed=args.seed,
            sla_tps=args.sla_tps,
            slo=args.slo,
            calibrate=args.calibrate,
            max_running=args.max_running,
            kv_tokens=args.kv_tokens,
            prefill_budget=args.prefill_budget,
            max_batched_tokens=args.max_batched_tokens,
            kv_block=args.kv_block if args.kv_block is not None else 16,
            serving=args.serving,
            kv=args.kv,
            require_steady=args.require_steady,
            record_tokens=False,
            progress=bar,
        )
    for w in caught:
        sys.stderr.write(f"specsim: warning: {w.message}\n")
    if out is not None:
        write_table(res.requests, out)
    if args.json:
        print(json.dumps(jsonable({**res.summary, "config": res.config}), sort_keys=True))
    else:
        print(table(res.summary, res.config))
        if out is not None:
            print(f"per-request table: {out}")
    return 0
