"""``specsim validate``: the simulator against the real engine on a (policy x concurrency) grid.

Writes under ``--out`` (default ``reports/fidelity``): ``fidelity.csv`` (real, sim and relative
error per cell), ``fidelity.png`` (sim against real), ``README.md`` (the table and how it was
made), ``engine_steps.parquet`` (every real step), ``profile.csv`` (the engine's measured cost
profile the simulator used) and ``config.json``. torch is imported inside ``run`` only.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from specsim.commands.engine import add_model_args, set_threads
from specsim.errors import SpecsimError
from specsim.outputs import write_text


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "validate",
        aliases=["fidelity"],
        help="measure the simulator against the real engine (the fidelity report; not to be "
        "confused with 'traces validate', which checks a trace file)",
    )
    add_model_args(p)
    p.add_argument(
        "--trace",
        type=Path,
        required=True,
        help="greedy trace of --prompts with --drafter (recorded here if missing)",
    )
    p.add_argument(
        "--prompts",
        nargs="+",
        required=True,
        help="the prompts the trace is (to be) recorded on, e.g. humaneval[:8]",
    )
    p.add_argument(
        "--policies",
        default="ar,mtp1,full,hw-aware",
        help="comma-separated policies (default: ar,mtp1,full,hw-aware)",
    )
    p.add_argument("--concurrency", default="1,2,4,8", help="closed-loop levels (default 1,2,4,8)")
    p.add_argument("--requests", type=int, default=None, help="jobs per cell (default: trace's)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="when recording the trace")
    p.add_argument(
        "--profile", default=None, help="use this SPS profile instead of measuring the engine's own"
    )
    p.add_argument("--contexts", default="64,256,512", help="profile contexts (comma-separated)")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per profile point")
    p.add_argument(
        "--prefill-budget",
        type=int,
        default=256,
        help="prompt tokens admitted per step (both sides)",
    )
    p.add_argument("--out", type=Path, default=Path("reports/fidelity"))
    p.add_argument("--force", action="store_true", help="overwrite the report in --out")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specsim.analysis.validate import (
        fidelity_markdown,
        parse_grid,
        plot_fidelity,
        run_validation,
    )

    cells = parse_grid(args.policies, args.concurrency)
    try:
        contexts = tuple(int(c) for c in args.contexts.split(","))
    except ValueError:
        raise SpecsimError(f"--contexts must be integers, got {args.contexts!r}") from None
    if (args.out / "fidelity.csv").exists() and not args.force:
        raise SpecsimError(f"{args.out / 'fidelity.csv'} exists; pass --force to overwrite it")
    set_threads(args.threads)
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    table = run_validation(
        trace_path=args.trace,
        prompt_specs=args.prompts,
        cells=cells,
        out_dir=args.out,
        target_spec=args.target,
        drafter_spec=args.drafter,
        requests=args.requests,
        max_new_tokens=args.max_new_tokens,
        profile=args.profile,
        profile_contexts=contexts,
        repeats=args.repeats,
        layout=args.layout,
        seed=args.seed,
        prefill_budget=args.prefill_budget,
        force=args.force,
        device=args.device,
        log=lambda m: print(m, file=sys.stderr, flush=True),
    )
    plot_fidelity(table, args.out / "fidelity.png")
    within = (table["err_throughput_tok_s"].abs() <= 0.05) & (
        table["err_tpot_ms_mean"].abs() <= 0.05
    )
    lines = [
        "# Fidelity: simulator against the real engine",
        "",
        "Made by (do not edit by hand; rerun it):",
        "",
        "```",
        "specsim " + " ".join(sys.argv[1:]),
        "```",
        "",
        f"Machine: {os.cpu_count()} CPU cores; torch threads {args.threads}; 1-min load "
        f"average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end "
        f"(per-cell loads in fidelity.csv); {time.perf_counter() - t0:.0f} s in all.",
        "",
        f"Cells within 5% on both throughput and mean TPOT: {int(within.sum())} of {len(table)}; "
        f"max |error| throughput {100 * table['err_throughput_tok_s'].abs().max():.1f}%, "
        f"mean TPOT {100 * table['err_tpot_ms_mean'].abs().max():.1f}%.",
        "",
        fidelity_markdown(table),
        "",
        "![simulated against measured](fidelity.png)",
        "",
        "Errors are (sim - real) / real. See docs/fidelity.md for the method and the error "
        "analysis.",
        "",
    ]
    write_text("\n".join(lines), args.out / "README.md")
    print(fidelity_markdown(table))
    return 0
