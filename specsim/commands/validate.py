"""``specsim validate``: the simulator against the real engine on a (policy x concurrency) grid.

Writes under ``--out`` (default ``reports/fidelity``): ``fidelity.csv`` (real mean and spread,
sim and relative error per cell, on the engine's clock and, closed loop, on the wall clock),
``runs.csv`` (every real run), ``decomposition.csv`` (per-step terms, real against model),
``hog.csv`` (``--hog-check``), ``terms.csv`` (what each cost term buys), ``fidelity.png`` (sim
against real, error histogram), ``README.md`` (the tables and how they were made),
``engine_steps.parquet`` (every real step),
``profile-<drafter>.csv`` (the engine's measured cost profile the simulator used, and its
other-clock twin) and ``config.json``. torch is imported inside ``run`` only.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from specsim.commands.engine import add_model_args, set_threads
from specsim.errors import SpecsimError


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
        "--drafters",
        default=None,
        help="comma-separated drafters to validate (default: --drafter); several need "
        "{drafter} in --trace",
    )
    p.add_argument(
        "--policies",
        default="ar,mtp1,full,hw-aware",
        help="comma-separated policies (default: ar,mtp1,full,hw-aware)",
    )
    p.add_argument("--concurrency", default="1,2,4,8", help="closed-loop levels (default 1,2,4,8)")
    p.add_argument(
        "--rates",
        default="",
        help="open-loop Poisson cells at these fractions of each policy's simulated capacity "
        "(closed loop at the largest C), e.g. 0.3,0.6,0.9 (default: none)",
    )
    p.add_argument(
        "--open-drafters",
        default=None,
        help="drafters that get the open-loop cells (default: the first of --drafters)",
    )
    p.add_argument(
        "--requests",
        type=int,
        default=None,
        help="jobs per cell (default: the trace's requests; a closed loop runs at least C)",
    )
    p.add_argument("--max-new-tokens", type=int, default=64, help="when recording the trace")
    p.add_argument(
        "--profile", default=None, help="use this SPS profile instead of measuring the engine's own"
    )
    p.add_argument("--contexts", default="64,256,512", help="profile contexts (comma-separated)")
    p.add_argument(
        "--profile-repeats", type=int, default=5, help="timed repeats per profile point (5)"
    )
    p.add_argument(
        "--repeats", type=int, default=1, help="real runs per closed-loop cell, for a spread (1)"
    )
    p.add_argument(
        "--open-repeats", type=int, default=None, help="real runs per open-loop cell (--repeats)"
    )
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        help="real runs at a time, each in its own process on its own core (1; more only with "
        "--clock ref). On the 2-core VM two workers' runs came out ~17%% slower on the ref "
        "clock than the profile, unseen by the probes (docs/fidelity.md, v8): a report uses 1",
    )
    p.add_argument(
        "--ref-every",
        type=float,
        default=1.0,
        help="--clock ref: engine CPU seconds between re-timings of the speed probes (1; this "
        "VM's speed moves within seconds: docs/fidelity.md; the probes cost ~20%% more wall time)",
    )
    p.add_argument(
        "--ref-window",
        type=int,
        default=1,
        help="--clock ref: the speed factor is the median of this many last probes (1)",
    )
    p.add_argument(
        "--ref-probe",
        choices=("cold", "warm"),
        default="cold",
        help="--clock ref: time each probe once, right after the engine's work (cold, the "
        "default: follows this VM better at half the probes' cost, benchmarks/README.md) or "
        "after a warm-up call (warm: the grids up to v5)",
    )
    p.add_argument(
        "--ref-large",
        type=int,
        default=64,
        help="--clock ref: tokens of a second, large target probe towards whose speed larger "
        "forwards are timed (64; 0: one 4-token probe for every forward, as up to v6: "
        "docs/fidelity.md)",
    )
    p.add_argument(
        "--ref-mid",
        type=int,
        default=0,
        help="--clock ref: tokens of a third target probe between the small and the large one "
        "(0, the default: none; e.g. 16)",
    )
    p.add_argument(
        "--ref-large-every",
        type=int,
        default=4,
        help="--clock ref: re-time the large probe at every N-th calibration only (4)",
    )
    p.add_argument(
        "--shared-table",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="time the target's step table once, with the passes of every drafter's profile "
        "pooled, and reuse it in each (the default: the forward does not depend on the "
        "drafter; more passes narrow a large point's scatter between profiles: "
        "benchmarks/README.md); --no-shared-table times one table per drafter",
    )
    p.add_argument(
        "--hog-check",
        action="store_true",
        help="first run one cell quiet, beside CPU hogs and beside memory hogs (one per core), "
        "to measure how far each clock moves (hog.csv)",
    )
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
    from specsim.analysis.fidelity_report import render, term_ablation
    from specsim.analysis.validate import fidelity_lines, parse_grid, run_validation
    from specsim.torch_engine.clock import check_clock

    cells = parse_grid(args.policies, args.concurrency, args.rates)
    try:
        contexts = tuple(int(c) for c in args.contexts.split(","))
    except ValueError:
        raise SpecsimError(f"--contexts must be integers, got {args.contexts!r}") from None
    for flag, v in (("--repeats", args.repeats), ("--profile-repeats", args.profile_repeats)):
        if v < 1:
            raise SpecsimError(f"{flag} must be at least 1, got {v}")
    if not args.ref_every > 0:
        raise SpecsimError(f"--ref-every must be positive seconds, got {args.ref_every}")
    if args.ref_large < 0 or 0 < args.ref_large <= 4:
        raise SpecsimError(
            f"--ref-large must be 0 (off) or more tokens than the small probe's 4, e.g. 64; "
            f"got {args.ref_large}"
        )
    if args.ref_mid and not (4 < args.ref_mid < args.ref_large):
        raise SpecsimError(
            f"--ref-mid must be 0 (off) or between the small probe's 4 tokens and --ref-large "
            f"({args.ref_large}), e.g. 16; got {args.ref_mid}"
        )
    if args.ref_large_every < 1:
        raise SpecsimError(f"--ref-large-every must be at least 1, got {args.ref_large_every}")
    if not 1 <= args.workers <= (os.cpu_count() or 1):
        raise SpecsimError(
            f"--workers must be between 1 and this machine's {os.cpu_count()} cores, got "
            f"{args.workers}"
        )
    if args.workers > 1 and args.clock != "ref":
        raise SpecsimError(
            f"--workers {args.workers} needs --clock ref: on the {args.clock} clock each run "
            "would time its neighbour too; pass --clock ref or --workers 1"
        )
    if args.ref_window < 1:
        raise SpecsimError(f"--ref-window must be at least 1, got {args.ref_window}")
    if args.open_repeats is not None and args.open_repeats < 1:
        raise SpecsimError(f"--open-repeats must be at least 1, got {args.open_repeats}")
    drafters = tuple(d.strip() for d in (args.drafters or args.drafter).split(",") if d.strip())
    open_drafters = None
    if args.open_drafters:
        open_drafters = tuple(d.strip() for d in args.open_drafters.split(",") if d.strip())
        bad = [d for d in open_drafters if d not in drafters]
        if bad:
            raise SpecsimError(f"--open-drafters {bad[0]!r} is not one of --drafters")
    if (args.out / "fidelity.csv").exists() and not args.force:
        raise SpecsimError(f"{args.out / 'fidelity.csv'} exists; pass --force to overwrite it")
    if args.workers > 1:
        print(
            f"warning: --workers {args.workers}: runs beside each other; on a 2-core VM they "
            "came out ~17% slower on the ref clock than the profile (docs/fidelity.md, v8)",
            file=sys.stderr,
        )
    check_clock(args.clock, args.device, args.threads)
    set_threads(args.threads)
    load_before = os.getloadavg()[0]
    table = run_validation(
        trace_path=args.trace,
        prompt_specs=args.prompts,
        cells=cells,
        out_dir=args.out,
        target_spec=args.target,
        drafters=drafters,
        open_drafters=open_drafters,
        requests=args.requests,
        max_new_tokens=args.max_new_tokens,
        profile=args.profile,
        profile_contexts=contexts,
        profile_repeats=args.profile_repeats,
        repeats=args.repeats,
        open_repeats=args.open_repeats,
        layout=args.layout,
        seed=args.seed,
        prefill_budget=args.prefill_budget,
        clock=args.clock,
        ref_every_s=args.ref_every,
        ref_window=args.ref_window,
        ref_probe=args.ref_probe,
        ref_large=args.ref_large,
        ref_large_every=args.ref_large_every,
        ref_mid=args.ref_mid,
        shared_table=args.shared_table,
        hogs=(os.cpu_count() or 1) if args.hog_check else 0,
        workers=args.workers,
        force=args.force,
        device=args.device,
        log=lambda m: print(m, file=sys.stderr, flush=True),
    )
    if args.profile is None:  # the ablation varies the measured profiles' terms
        term_ablation(args.out)
    note = f"(1-min load {load_before:.2f} when the command started.)"
    render(args.out, "specsim " + " ".join(sys.argv[1:]), note)
    print(fidelity_lines(table))
    return 0
