"""``specsim traces``: inspect, check and synthesise trace files (docs/trace-format.md).

specsim traces info traces/synthetic-chat.parquet [--json]
specsim traces validate my-trace.parquet
specsim traces synth --out my.parquet --profile math --requests 200 --seed 1
specsim traces synth --out my.parquet --profile custom 0.8,0.7,0.6 --auroc 0.9
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from specsim.errors import SpecsimError
from specsim.outputs import jsonable


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "traces",
        help="inspect (info), check (validate) or generate (synth) trace files",
        description=__doc__.split("\n")[0],
    )
    p.set_defaults(func=lambda args: _usage(p))
    tsub = p.add_subparsers(dest="traces_command", metavar="ACTION", parser_class=type(p))

    info = tsub.add_parser("info", help="statistics of a trace: tau, acceptance, AUROC, ECE")
    info.add_argument("file", metavar="FILE", help="trace file (.parquet)")
    info.add_argument("--json", action="store_true", help="print one JSON object instead")
    info.set_defaults(func=run_info)

    val = tsub.add_parser("validate", help="check a file against trace format v1")
    val.add_argument("file", metavar="FILE", help="trace file (.parquet)")
    val.set_defaults(func=run_validate)

    syn = tsub.add_parser("synth", help="write a synthetic trace with calibrated confidences")
    syn.add_argument("--out", required=True, metavar="FILE", help="output trace (.parquet)")
    syn.add_argument(
        "--profile",
        nargs="+",
        default=["chat"],
        metavar="NAME",
        help="chat, code or math (published curves), or 'custom 0.8,0.7,...' (conditional "
        "acceptance per draft position)",
    )
    syn.add_argument(
        "--al",
        type=float,
        default=None,
        help="instead of --profile: a published acceptance length (tokens a verify step emits, "
        "bonus included) for --block-size drafts (a tree: its accepted path, its depth); one "
        "conditional acceptance at every position",
    )
    syn.add_argument("--requests", type=int, default=200, help="number of requests (200)")
    syn.add_argument(
        "--block-size", type=int, default=None, help="gamma (default: the profile's length)"
    )
    syn.add_argument("--auroc", type=float, default=None, help="target AUROC (0.85)")
    syn.add_argument(
        "--concentration", type=float, default=None, help="Beta concentration (instead of AUROC)"
    )
    syn.add_argument(
        "--calibration",
        default="calibrated",
        help="'calibrated' or a logit factor: >1 over-confident, <1 under-confident",
    )
    syn.add_argument("--output-len", type=float, default=220, help="median output tokens (220)")
    syn.add_argument("--prompt-len", type=float, default=512, help="median prompt tokens (512)")
    syn.add_argument("--category", default=None, help="category column (default: profile name)")
    syn.add_argument("--seed", type=int, default=0, help="random seed (0)")
    syn.add_argument(
        "--mixture",
        nargs=2,
        action="append",
        metavar=("WEIGHT", "RATES"),
        help="a request-level mixture component, e.g. --mixture 0.5 0.95,0.9 --mixture 0.5 0.3 "
        "(bimodal acceptance: each request's profile drawn from the components)",
    )
    syn.add_argument(
        "--decay-to",
        type=float,
        default=None,
        help="acceptance rates fall linearly along each output to this factor (0, 1]",
    )
    syn.add_argument("--force", action="store_true", help="overwrite --out")
    syn.set_defaults(func=run_synth)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def _fmt(x: float, digits: int = 3) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def run_info(args: argparse.Namespace) -> int:
    from specsim.trace.io import read_trace
    from specsim.trace.stats import per_position_table, trace_stats

    trace = read_trace(args.file)
    stats = trace_stats(trace)
    table = per_position_table(trace)
    if args.json:
        out = {"file": args.file, "meta": trace.meta, **stats}
        out["per_position"] = table.to_dict(orient="records")
        print(json.dumps(jsonable(out), sort_keys=False))
        return 0
    meta = trace.meta
    lines = [
        f"trace      {args.file}",
        "source     "
        + "  ".join(
            f"{k}={meta[k]}" for k in ("source", "target", "drafter", "temperature") if k in meta
        ),
        f"requests   {stats['requests']:,}   rows {stats['rows']:,}   tokens "
        f"{stats['tokens']:,}   block size {stats['gamma']} (drafts per step)",
        "acceptance length tau, in tokens per verification step (the bonus token included):",
        f"  tau_replay       {_fmt(stats['tau_replay'])} tokens/step   95% CI "
        f"[{_fmt(stats['tau_ci95'][0])}, {_fmt(stats['tau_ci95'][1])}]   full-verification "
        "replay (the papers' tau)",
        f"  tau_rows         {_fmt(stats['tau_rows'])} tokens/step   1 + mean accept_len over "
        "all rows, skipped positions too",
        f"  tokens_per_step  {_fmt(stats['tokens_per_step'])} tokens/step   tokens / "
        f"{stats['replay_steps']:,} replay steps (last blocks capped)",
        "confidence quality (AUROC 0.5 is chance, 1 perfect; ECE 0 is calibrated):",
        f"  conditional c_k  AUROC {_fmt(stats['conf_auroc'])}   ECE {_fmt(stats['conf_ece'])}"
        "   label: draft k accepted, given drafts < k were",
        f"  survival a_k     AUROC {_fmt(stats['survival_auroc'])}   ECE "
        f"{_fmt(stats['survival_ece'])}   label: accept_len >= k",
        "(definitions: docs/trace-format.md, Statistics; the CI resamples whole requests)",
        "",
        "  k          n   accept rate   mean c_k   P(accept_len>=k)   mean a_k",
    ]
    for r in table.itertuples():
        lines.append(
            f"{r.k:3d} {r.n:10,d}   {_fmt(r.accept_rate):>11}   {_fmt(r.mean_conf):>8}   "
            f"{_fmt(r.survival_rate):>16}   {_fmt(r.survival_mean):>8}"
        )
    cats = stats.get("categories")
    if cats:
        lines += ["", "category          requests     tokens    tau   AUROC    ECE"]
        for name, c in cats.items():
            lines.append(
                f"{name[:16]:16} {c['requests']:9,d} {c['tokens']:10,d} "
                f"{_fmt(c['tau_replay'], 2):>6} {_fmt(c['conf_auroc']):>7} {_fmt(c['conf_ece']):>6}"
            )
    print("\n".join(lines))
    return 0


def run_validate(args: argparse.Namespace) -> int:
    from specsim.trace.io import validate_file

    trace = validate_file(args.file)
    print(f"ok: {trace.n_requests} requests, {trace.n_rows} rows")
    return 0


def _profile(values: list[str]) -> tuple[str, tuple[float, ...]]:
    from specsim.trace.synth import PROFILES

    name = values[0]
    if name in PROFILES and len(values) == 1:
        return name, PROFILES[name]
    rest = values[1:] if name == "custom" else values
    text = ",".join(rest)
    try:
        profile = tuple(float(v) for v in text.replace(" ", ",").split(",") if v)
    except ValueError:
        profile = ()
    if not profile:
        raise SpecsimError(
            f"--profile {' '.join(values)!r} is not chat, code, math or 'custom 0.8,0.7,...' "
            "(conditional acceptance per draft position)"
        )
    return "custom", profile


# Bounds of a synthetic trace: real drafters verify 1-16 tokens a step; lengths and counts far
# beyond any benchmark would only make a file of gigabytes (or a run of hours) by mistake.
MAX_BLOCK = 64
MAX_LEN = 1_000_000
MAX_SYNTH_REQUESTS = 1_000_000


def run_synth(args: argparse.Namespace) -> int:
    from specsim.outputs import claim

    # checked and locked before the synthesis: a full run never ends in "cannot write"
    with claim(args.out, force=args.force, suffixes=(".parquet",)) as out:
        return _synth(args, out)


def _synth(args: argparse.Namespace, out) -> int:  # noqa: ANN001 - a Path from claim
    from specsim.trace.io import write_trace
    from specsim.trace.stats import trace_stats
    from specsim.trace.synth import DEFAULT_AUROC, LogNormal, fit_profile, synth_trace

    name, profile = _profile(args.profile)
    if args.al is not None:
        from specsim.trace.synth import profile_from_al

        if args.block_size is None:
            raise SpecsimError("--al needs --block-size: the drafts (chain) or depth (tree)")
        if not 1 <= args.block_size <= MAX_BLOCK:
            raise SpecsimError(f"--block-size {args.block_size} must be in [1, {MAX_BLOCK}]")
        name, profile = f"al-{args.al:g}", profile_from_al(args.al, args.block_size)
    gamma = args.block_size if args.block_size is not None else len(profile)
    if not 1 <= gamma <= MAX_BLOCK:
        raise SpecsimError(
            f"--block-size {gamma} must be in [1, {MAX_BLOCK}] (drafters verify blocks of 1-16)"
        )
    profile = fit_profile(profile, gamma)
    for flag, v, lo in (("--output-len", args.output_len, 1), ("--prompt-len", args.prompt_len, 0)):
        if not (math.isfinite(v) and lo <= v <= MAX_LEN):
            raise SpecsimError(f"{flag} {v} must be a number of tokens in [{lo}, {MAX_LEN:,}]")
    if not 1 <= args.requests <= MAX_SYNTH_REQUESTS:
        raise SpecsimError(f"--requests {args.requests} must be in [1, {MAX_SYNTH_REQUESTS:,}]")
    auroc = args.auroc if args.concentration is None else None
    if auroc is None and args.concentration is None:
        auroc = DEFAULT_AUROC
    mixture = None
    if args.mixture:
        try:
            mixture = [(float(w), [float(x) for x in r.split(",")]) for w, r in args.mixture]
        except ValueError:
            raise SpecsimError(
                "--mixture takes a weight and comma-separated rates, e.g. --mixture 0.5 0.9,0.8"
            ) from None
    trace = synth_trace(
        n_requests=args.requests,
        mixture=mixture,
        decay_to=args.decay_to,
        accept_profile=profile,
        gamma=gamma,
        prompt_len=LogNormal(args.prompt_len, 0.8, 16, 8192),
        output_len=LogNormal(
            args.output_len, 0.35, max(1, int(args.output_len) // 4), int(args.output_len) * 3
        ),
        auroc=auroc,
        concentration=args.concentration,
        calibration=args.calibration,
        seed=args.seed,
        category=args.category or name,
    )
    path = write_trace(trace, out, force=args.force)
    s = trace_stats(trace)
    target = f" (target {auroc})" if auroc is not None else ""
    print(
        f"wrote {path}: {s['requests']} requests, {s['rows']} rows, tau {s['tau_replay']:.3f}, "
        f"AUROC {s['conf_auroc']:.3f}{target}, ECE {s['conf_ece']:.4f}"
    )
    return 0
