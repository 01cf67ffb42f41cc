"""``specsim replay``: replay a trace through the simulated server under a policy and a load.

specsim replay traces/synthetic-chat.parquet --policy hw-aware --concurrency 64
specsim replay my.parquet --policy zos --arrivals azure-conv --requests 2000 --json
specsim replay my.parquet --policy mtp1 --rate 20 --cv 3 --profile v4-flash-8xh20 --sla-tps 80
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from pathlib import Path

from specsim.commands.common import (
    POLICY_HELP,
    add_burstiness,
    add_profile,
    add_seed,
    resolve_cv,
)
from specsim.outputs import claim, jsonable, write_table


def register(sub: argparse._SubParsersAction) -> None:
    from specsim.sim.config import DEFAULT_POLICY, default, flag_help

    p = sub.add_parser(
        "replay",
        help="replay a trace in the serving simulator under a policy and a load",
        description=__doc__.split("\n")[0],
    )
    p.add_argument(
        "trace",
        metavar="TRACE",
        help="trace file (.parquet) or a shipped trace name (chat, code, math)",
    )
    p.add_argument(
        "--policy", default=DEFAULT_POLICY, help=f"{POLICY_HELP} (default: {DEFAULT_POLICY})"
    )
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
    for name in ("max_running", "kv_tokens", "max_batched_tokens", "kv_block"):
        p.add_argument("--" + name.replace("_", "-"), type=int, help=flag_help(name))
    # one model: any other value (a saved v1 command) is refused in a line by ReplayConfig
    p.add_argument("--serving", metavar="v2", default=default("serving"),
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
    p.add_argument(
        "--stream",
        action="store_true",
        help="summarize as requests finish and keep no per-request rows (flat memory): the "
        "same counts, means, SLA/SLO shares and goodput; percentiles exact up to 100,000 "
        "requests, within 0.5%% (a DDSketch) beyond; --out (.parquet) is written in row groups",
    )
    p.add_argument("--spread", metavar="P1,P2,...",
                   help="also replay on these profiles (e.g. the --assume low and high builds "
                   "of --profile) and print each headline's span over them")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print one JSON object (summary+config)")
    p.set_defaults(func=run)


SPREAD = (("Output token throughput (tok/s)", "throughput_tok_s", ",.0f"),
          ("Steady-state output throughput (tok/s)", "steady_throughput_tok_s", ",.0f"),
          ("Mean TTFT (ms)", "ttft_ms_mean", ".1f"),
          ("Mean TPOT (ms)", "tpot_ms_mean", ".2f"),
          ("Per-user speed, mean (tok/s)", "per_user_tps_mean", ".1f"))  # fmt: skip


def spread_text(summary: dict, others: dict[str, dict]) -> str:
    """Each headline of the run beside its span over the ``--spread`` profiles' runs (the same
    trace, load and seed): what the assumptions behind a built profile move, in the units the
    user reads. Why: a single number from an assumed profile reads as a measurement."""
    names = ", ".join(others)
    lines = [f" Spread over {len(others)} profile{'s' * (len(others) > 1)} ".center(60, "-"),
             f"(the same trace, load and seed on: {names})"]  # fmt: skip
    for label, key, spec in SPREAD:
        vals = [o.get(key, math.nan) for o in others.values()]
        vals = [v for v in vals if isinstance(v, int | float) and math.isfinite(v)]
        x = summary.get(key, math.nan)
        if not vals or not math.isfinite(x):
            continue
        lo, hi = min(vals + [x]), max(vals + [x])
        lines.append(f"{label:<42}{_fmt(x, spec):>12}  ({_fmt(lo, spec)} - {_fmt(hi, spec)})")
    return "\n".join(lines)


def _fmt(x: float, spec: str = ".1f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:{spec}}"


def _lat(s: dict, name: str, label: str, spec: str) -> list[tuple[str, str]]:
    """Mean, median and tail of one latency, the way `vllm bench serve` lists them."""
    rows = [(f"Mean {label} (ms)", _fmt(s.get(f"{name}_ms_mean"), spec))]
    rows.append((f"Median {label} (ms)", _fmt(s.get(f"{name}_ms_p50"), spec)))
    rows += [(f"P{q} {label} (ms)", _fmt(s.get(f"{name}_ms_p{q}"), spec)) for q in (90, 99)]
    return rows


def table(summary: dict, config: dict, requested: str | None = None) -> str:
    """The readable report, laid out like `vllm bench serve` so its users find their numbers.

    ``requested``: the policy name as the user typed it (``auto`` runs ``calibrated-zos``).
    Every throughput is the whole deployment's (what vLLM's bench measures of a server, what
    ``specsim tune`` ranks and what ``--json`` holds) and says so, with the per-GPU figure that
    the sweep's figures plot beside it: a multi-GPU profile's total is ``gpus`` times larger,
    and a reader comparing the two outputs must not take one for the other.
    """
    s, c = summary, config
    gpus = int(s.get("gpus", 1))
    name = c["policy"] + (" (ZOS)" if c["zos"] else "")
    if requested and requested != c["policy"]:
        name = f"{requested} = {name}"
    basis = f"for the deployment ({gpus} GPU{'s' if gpus > 1 else ''})"

    def rate(x: float, spec: str) -> tuple[str, str]:
        per = f", {_fmt(x / gpus, spec)} per GPU" if gpus > 1 else ""
        return _fmt(x, spec), basis + per

    head: list[tuple[str, ...]] = [
        ("Policy", name),
        ("Load", c["load"]),
        (
            "Profile",
            c["profile"]
            + (f" ({gpus} GPUs)" if gpus > 1 else "")
            + (
                f", FITTED on your baseline ({c['profile_fitted']})"
                if c.get("profile_fitted")
                else ""
            ),
        ),  # fmt: skip
        ("Successful requests", f"{s['requests_completed']:,}"),
        ("Benchmark duration (s, simulated)", _fmt(s["sim_time_s"], ".2f")),
        ("Total input tokens", f"{s.get('input_tokens', 0):,}"),
        ("Total generated tokens", f"{s['output_tokens']:,}"),
        ("Request throughput (req/s)", *rate(s["request_throughput"], ".2f")),
        ("Output token throughput (tok/s)", *rate(s["throughput_tok_s"], ",.0f")),
        ("Total token throughput (tok/s)", *rate(s["total_throughput_tok_s"], ",.0f")),
    ]
    if math.isfinite(s["steady_throughput_tok_s"]):
        head.append(
            ("Steady-state output throughput (tok/s)", *rate(s["steady_throughput_tok_s"], ",.0f"))
        )
    head += [
        ("Achieved concurrency", _fmt(s["achieved_concurrency"], ".1f")),
        ("Per-user speed, mean (tok/s)", _fmt(s["per_user_tps_mean"]), "per request"),
    ]
    spec = [
        ("tau (tokens/step/request)", _fmt(s["tau"], ".3f")),
        ("Verify efficiency (accepted/verified)", _fmt(s["verify_efficiency"], ".3f")),
        ("Mean batch (tokens/step)", _fmt(s["mean_batch_tokens"])),
    ]
    if s.get("preemptions"):
        spec.append(
            ("Preemptions", f"{s['preemptions']:,} ({s['recomputed_tokens']:,} tokens recomputed)")
        )
    if c.get("slo_ms"):
        slo = ", ".join(f"{k} <= {v:g} ms" for k, v in c["slo_ms"].items())
        spec.append(("Goodput (req/s)", f"{_fmt(s['goodput_req_s'], '.2f')} meet {slo} "
                                        f"({_fmt(100 * s['slo_attainment'])}%)"))  # fmt: skip
    if c.get("sla_tps") is not None:
        spec.append((f"SLA >= {c['sla_tps']:g} tok/s", f"{_fmt(100 * s['sla_attainment'])}%"))
    sections = [
        ("Serving result (simulated)", head),
        ("Time to First Token", _lat(s, "ttft", "TTFT", ".1f")),
        ("Time per Output Token (excl. 1st token)", _lat(s, "tpot", "TPOT", ".2f")),
        ("Inter-token Latency", [*_lat(s, "itl", "ITL", ".2f"), _itl_tail(s)]),
        ("End-to-end Latency", _lat(s, "e2e", "E2EL", ",.0f")),
        ("Speculative decoding", spec),
    ]
    width = max(len(row[0]) for _, rows in sections for row in rows) + 2
    lines: list[str] = []
    for title, rows in sections:
        lines.append(f" {title} ".center(width + 14, "=" if not lines else "-"))
        lines += [_row(width, *row) for row in rows]
    lines.append(f"wall time: {_fmt(s['wall_time_s'], '.2f')} s")
    return "\n".join(lines + _notes(s, c))


def _row(width: int, label: str, value: str, note: str = "") -> str:
    """``label: value``, a value of up to 12 characters right-aligned in one column, then the
    note that says what the value is (its basis: the deployment or one GPU)."""
    line = (
        f"{label + ':':<{width}}{value:>12}"
        if len(value) <= 12
        else f"{label + ':':<{width}}{value}"
    )
    return f"{line}  {note}" if note else line


def _itl_tail(s: dict) -> tuple[str, str]:
    return (
        "P99.9 / max ITL (ms)",
        f"{_fmt(s['itl_ms_p99.9'], '.2f')} / {_fmt(s['itl_ms_max'], '.2f')}",
    )


def _notes(s: dict, c: dict) -> list[str]:
    """What a reader of the numbers above should know and would not guess."""
    notes = []
    if not c.get("concurrency") and c.get("requests") is None and c.get("duration") is None:
        notes.append(
            f"note: {s['requests_completed']} requests (the trace's count); a P99 over so few "
            "is noisy: pass --requests N (vLLM's default is 1000)"
        )
    if c.get("concurrency"):
        notes.append(
            f"note: closed loop: the first {c['concurrency']} requests arrive at t=0 and are "
            "prefilled together, so TTFT percentiles can coincide; use --rate for the TTFT a "
            "user meets"
        )
    return notes


def run(args: argparse.Namespace) -> int:
    with claim(args.out, force=args.force) as out:  # checked and locked before the work
        return _run(args, out)


def _run(args: argparse.Namespace, out: Path | None) -> int:
    from specsim.errors import SpecsimError
    from specsim.progress import Progress
    from specsim.sim.simulate import replay

    stream = bool(getattr(args, "stream", False))
    if stream and out is not None and out.suffix.lower() != ".parquet":
        raise SpecsimError(f"--stream writes --out as Parquet row groups: give a .parquet file, "
                           f"not {str(out)!r}")  # fmt: skip

    cv = resolve_cv(args)
    from specsim.trace.io import read_trace

    trace = read_trace(args.trace)
    spread = _spread_names(args)  # before the run: a typo costs no minutes
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
            max_batched_tokens=args.max_batched_tokens,
            kv_block=args.kv_block if args.kv_block is not None else 16,
            serving=args.serving,
            kv=args.kv,
            require_steady=args.require_steady,
            record_tokens=False,
            stream=stream,
            requests_out=str(out) if stream and out is not None else None,
            progress=bar,
        )
    for w in caught:
        sys.stderr.write(f"specsim: warning: {w.message}\n")
    if out is not None and not stream:  # streamed: written as the run went
        write_table(res.requests, out)
    others = _spread(args, trace, cv, spread)
    if args.json:
        extra = {"spread": others} if others else {}
        print(json.dumps(jsonable({**res.summary, "config": res.config, **extra}),
                         sort_keys=True))  # fmt: skip
    else:
        print(table(res.summary, res.config, requested=args.policy))
        if others:
            print(spread_text(res.summary, others))
        if out is not None:
            print(f"per-request table: {out}")
    return 0


def _spread_names(args: argparse.Namespace) -> list[str]:
    """The ``--spread`` profiles as given, each loaded once to refuse a missing or malformed
    one in a line before any replay."""
    if getattr(args, "spread", None) is None:
        return []
    from specsim.options import split_items
    from specsim.sim.cost.profiles import get_profile

    names = split_items(args.spread, "--spread")
    for name in names:
        get_profile(name)
    return names


def _spread(args: argparse.Namespace, trace: object, cv: float | None, names: list[str]
            ) -> dict[str, dict]:  # fmt: skip
    """The ``--spread`` profiles' summaries, keyed by the profile as given (each one replayed
    with every other setting of the run)."""
    if not names:
        return {}
    from specsim.sim.simulate import replay

    kw = dict(rate=args.rate, concurrency=args.concurrency, arrivals=args.arrivals, cv=cv,
              requests=args.requests, duration=args.duration, seed=args.seed,
              sla_tps=args.sla_tps, slo=args.slo, calibrate=args.calibrate,
              max_running=args.max_running, kv_tokens=args.kv_tokens,
              max_batched_tokens=args.max_batched_tokens,
              kv_block=args.kv_block if args.kv_block is not None else 16,
              serving=args.serving, kv=args.kv, require_steady=args.require_steady,
              record_tokens=False, stream=True)  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the main run said them
        return {n: replay(trace, args.policy, profile=n, **kw).summary for n in names}
