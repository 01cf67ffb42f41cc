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

from specsim.commands.engine import add_model_args, set_threads
from specsim.errors import SpecsimError


def register(sub: argparse._SubParsersAction) -> None:
    from specsim.fidelity.config import ValidationConfig
    from specsim.options import add_options

    p = sub.add_parser(
        "validate",
        aliases=["fidelity"],
        help="measure the simulator against the real engine (the fidelity report; not to be "
        "confused with 'traces validate', which checks a trace file)",
    )
    add_model_args(p, drafter=False)  # target, device, threads, layout, clock, seed
    add_options(p, ValidationConfig)  # every other knob, defaults and help from the dataclass
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specsim.fidelity.ablation import term_ablation
    from specsim.fidelity.config import ValidationConfig
    from specsim.fidelity.grid import run_validation
    from specsim.fidelity.metrics import fidelity_lines
    from specsim.fidelity.report import render
    from specsim.options import from_args
    from specsim.torch_engine.clock import check_clock

    cfg = from_args(ValidationConfig, args)
    cfg.cells  # noqa: B018 - a bad grid is refused now, before the models load
    if (cfg.out / "fidelity.csv").exists() and not cfg.force:
        raise SpecsimError(f"{cfg.out / 'fidelity.csv'} exists; pass --force to overwrite it")
    if cfg.workers > 1:
        print(
            f"warning: --workers {cfg.workers}: runs beside each other; on a 2-core VM they "
            "came out ~17% slower on the ref clock than the profile (docs/fidelity.md)",
            file=sys.stderr,
        )
    check_clock(cfg.clock, cfg.device, args.threads)
    set_threads(args.threads)
    load_before = os.getloadavg()[0]
    table = run_validation(cfg, log=lambda m: print(m, file=sys.stderr, flush=True))
    if cfg.profile is None:  # the ablation varies the measured profiles' terms
        term_ablation(cfg.out)
    note = f"(1-min load {load_before:.2f} when the command started.)"
    render(cfg.out, "specsim " + " ".join(sys.argv[1:]), note)
    print(fidelity_lines(table))
    return 0
