"""``specsim profile build|fit|import|export|show|measure``: cost profiles from and for engines.

specsim profile measure --target smollm2 --out my-cpu.csv          # time a target here
specsim profile import vllm-adaptive verify_cost.csv draft_cost.csv --out my-b300.csv
specsim profile import trtllm cost_table.json --out my-trtllm.csv
specsim profile import table steps.csv --out my-gpu.csv --interpolation step
specsim profile import bench c1.json c8.json c32.json --out my-bench.csv
specsim profile export v4-pro-16xh20 --format vllm-adaptive --out v4-pro-tables/
specsim profile export v4-pro-16xh20 --format trtllm --out cost_table.json --context 2048
specsim profile show my-b300.csv
specsim profile build --model llama-3-8b --gpu h100 --drafter dspark:layers=5,block=7 --out my.csv
specsim profile fit --model llama-3-8b --gpu h100 --baseline c1.json c32.json --out fitted.csv

``specsim profile --out FILE ...`` (no action) is the older spelling of ``profile measure``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from specsim.commands.profile_args import (  # noqa: F401 - the flags' value rules
    _arg,
    _capture,
    _context,
    _degree,
    _engine_limit,
    _positive_int,
    _sizes,
    _tokens_per_request,
)
from specsim.errors import SpecsimError


def legacy_argv(argv: list[str]) -> list[str]:
    """``specsim profile --out F ...`` -> ``specsim profile measure --out F ...``. Only a flag
    after ``profile`` is the older spelling: a word that is no action (``profile frobnicate``)
    is left for argparse to refuse, not run as ``measure``."""
    if (argv[:1] == ["profile"] and len(argv) > 1 and argv[1].startswith("-")
            and argv[1] not in ("-h", "--help")):  # fmt: skip
        return ["profile", "measure", *argv[1:]]
    return argv


def register(sub: argparse._SubParsersAction) -> None:
    from specsim.commands.record import add_measure_args

    p = sub.add_parser(
        "profile",
        help="cost profiles: build one for your deployment (and fit it to your runs without "
        "speculation), import an engine's measured tables, export, show, measure a target here",
        description=__doc__.split("\n\n")[0],
    )
    acts = p.add_subparsers(dest="action", metavar="ACTION", parser_class=type(p))
    add_measure_args(acts.add_parser("measure", help="time a target's step against token batch"))

    imp = acts.add_parser(
        "import",
        help="read an engine's measured step costs into a profile CSV --profile takes",
        description="vllm-adaptive: vLLM's adaptive-verification startup tables (verify cost by "
        "tokens, then draft cost by requests; CSV or JSON, us or ms by column name); trtllm: "
        "TensorRT-LLM's DSpark cost table JSON (confidence_cost_table_path); sglang: SGLang's "
        "DSpark SPS table JSON (--speculative-dspark-sps-table-path); table: a "
        "measured tokens[,context] -> ms table; bench: 'vllm bench serve --save-result' or "
        "'specsim bench --json' files of runs without speculation, one per concurrency. "
        "Every value is checked: a step costs 1 us to 1 hour, sizes and counts are whole "
        "numbers up to 1,000,000. No format records its GPU count: give --gpus (otherwise 1 "
        "is assumed, and said on stderr).",
    )
    imp.add_argument("format", choices=("vllm-adaptive", "trtllm", "sglang", "table", "bench"))
    imp.add_argument("files", nargs="+", type=Path, help="the measured table(s) or result files")
    imp.add_argument("--out", type=Path, required=True, help="profile CSV to write")
    imp.add_argument(
        "--name", help="profile name, no control characters (default: the --out file stem)"
    )
    imp.add_argument(
        "--interpolation",
        choices=("linear", "step"),
        help="between table points: step = a batch pays the next measured (captured) size; "
        "default: step for vllm-adaptive, linear otherwise",
    )
    imp.add_argument(
        "--capture-max-tokens",
        type=_capture,
        default=None,
        help="largest CUDA-graph capture size: the staircase ends there, eager steps beyond "
        "are continuous (default: from a 'region' column, else the whole table)",
    )
    imp.add_argument(
        "--monotonic",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="force a running maximum over sizes (default: on for vllm-adaptive, as vLLM "
        "does, off otherwise); --no-monotonic keeps the measured costs as they are (past the "
        "table's end a falling last segment is held flat)",
    )
    imp.add_argument(
        "--draft-free",
        action="store_true",
        help="vllm-adaptive with the verify table only: drafting costs nothing (say so; "
        "otherwise the draft table is required)",
    )
    imp.add_argument("--max-running", type=_positive_int, help="requests a step may hold")
    imp.add_argument("--kv-tokens", type=_positive_int, help="KV cache capacity in tokens")
    imp.add_argument(
        "--max-batched-tokens", type=_positive_int, help="tokens a step may hold (vLLM's name)"
    )
    imp.add_argument(
        "--gpus",
        type=_positive_int,
        help="GPUs the tables were measured on: the tensor x pipeline parallel size (--gpus 4 "
        "for TP4); per-GPU throughput divides by it (default 1, with a note on stderr)",
    )
    imp.add_argument("--force", action="store_true", help="overwrite --out")
    imp.set_defaults(func=run_import)

    exp = acts.add_parser(
        "export",
        help="write a profile in an engine's form (vLLM's two tables, TensorRT-LLM's cost "
        "table, SGLang's SPS table, or a plain step table)",
    )
    exp.add_argument("profile", help="a built-in profile name or a profile CSV")
    exp.add_argument(
        "--format", choices=("vllm-adaptive", "trtllm", "sglang", "table"), default="vllm-adaptive"
    )
    exp.add_argument(
        "--out",
        type=Path,
        required=True,
        help="a folder (vllm-adaptive: verify_cost.csv and draft_cost.csv), a .json (trtllm, "
        "sglang) or a .csv (table)",
    )
    exp.add_argument("--gamma", type=_positive_int, default=7, help="draft block size (7)")
    exp.add_argument(
        "--context", type=_context, default=0.0, help="context tokens per request the "
        "steps are timed at (the KV each sequence reads; default 0)",
    )  # fmt: skip
    exp.add_argument("--contexts", help="table: comma-separated contexts (a tokens x context grid)")
    exp.add_argument(
        "--tokens-per-request",
        type=_tokens_per_request,
        default=1.0,
        help="verified tokens per request in a timed step, >= 1 (1 = decode; default 1)",
    )
    exp.add_argument("--tokens", type=_sizes, help="token counts to write (default: capture "
                     "sizes to 1024, then powers of two)")  # fmt: skip
    exp.add_argument("--capture-max-tokens", type=_capture, default=1024)
    exp.add_argument("--force", action="store_true", help="overwrite the output file(s)")
    exp.set_defaults(func=run_export)

    show = acts.add_parser("show", help="what a profile charges: steps, drafting, limits, source")
    show.add_argument("profile", help="a built-in profile name or a profile CSV")
    show.add_argument("--json", action="store_true", help="one JSON object")
    show.set_defaults(func=run_show)

    from specsim.commands.profile_build import add_build_args

    add_build_args(acts)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _scalars(args: argparse.Namespace) -> dict:
    keys = ("max_running", "kv_tokens", "max_batched_tokens", "gpus")
    return {k: getattr(args, k) for k in keys if getattr(args, k) is not None}


def import_profile(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The CostModel ``profile import`` builds from ``args`` (also used by tests)."""
    from dataclasses import replace

    from specsim.sim.cost import profile_import as pi
    from specsim.sim.cost.profile_csv import plain_text

    name = plain_text(args.name or args.out.stem, "--name")
    files = [str(f) for f in args.files]
    monotonic = args.monotonic if args.monotonic is not None else args.format == "vllm-adaptive"
    extra = _scalars(args)
    if getattr(args, "draft_free", False) and args.format != "vllm-adaptive":
        raise SpecsimError("--draft-free is for vllm-adaptive (a verify table without a draft one)")
    if args.format == "vllm-adaptive":
        if len(files) > 2:
            raise SpecsimError(
                "profile import vllm-adaptive takes the verify table, then the draft table; got "
                f"{len(files)} files"
            )
        model = pi.from_vllm_adaptive(
            files[0],
            files[1] if len(files) > 1 else None,
            name=name,
            capture_max_tokens=args.capture_max_tokens,
            monotonic=monotonic,
            draft_free=getattr(args, "draft_free", False),
            **extra,
        )
        return replace(model, interpolation="linear") if args.interpolation == "linear" else model
    if args.format in ("trtllm", "sglang"):
        if len(files) != 1:
            raise SpecsimError(
                f"profile import {args.format} takes one JSON file; got {len(files)}"
            )
        read = pi.from_trtllm if args.format == "trtllm" else pi.from_sglang
        model = read(files[0], name=name, **extra)
        if args.interpolation == "step":
            model = replace(
                model, interpolation="step", capture_max_tokens=args.capture_max_tokens or 0
            )
        return model
    if args.format == "table":
        if len(files) != 1:
            raise SpecsimError(f"profile import table takes one table file; got {len(files)}")
        return pi.from_table(
            files[0],
            name=name,
            interpolation=args.interpolation or "linear",
            capture_max_tokens=args.capture_max_tokens or 0,
            monotonic=monotonic,
            **extra,
        )
    model = pi.from_bench(files, name=name, **extra)
    if monotonic:
        model = replace(model, step_ms=pi.running_max(model.step_ms))
    return replace(model, interpolation="step") if args.interpolation == "step" else model


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)  # hard links and symlinks too
    except OSError:
        return a.resolve() == b.resolve()


def run_import(args: argparse.Namespace) -> int:
    from specsim.outputs import claim
    from specsim.sim.cost.profile_csv import write_profile_csv

    for f in args.files:
        if _same_file(Path(f), args.out):
            raise SpecsimError(
                f"--out {str(args.out)!r} is also an input ({str(f)!r}); write the profile to "
                "another file (refused even with --force: it would replace the table it reads)"
            )
    with claim(args.out, force=args.force, suffixes=(".csv",)) as out:
        model = import_profile(args)
        text = summary_text(model)  # everything that can fail, before the file is written
        write_profile_csv(model, out, force=True)
    print(text)
    print(f"wrote {out}; replay with --profile {out}", file=sys.stderr)
    if args.gpus is None:
        print(
            "specsim: note: no --gpus given, so the tables are taken as measured on 1 GPU (per-"
            "GPU throughput is the whole deployment's); for TP4 re-import with --gpus 4",
            file=sys.stderr,
        )
    return 0


def run_export(args: argparse.Namespace) -> int:
    from specsim.sim.cost.profile_export import to_table, to_vllm_adaptive
    from specsim.sim.cost.profiles import get_profile

    model = get_profile(args.profile)
    if args.format == "vllm-adaptive":
        if args.out.suffix.lower() == ".csv":
            raise SpecsimError(
                f"--out {str(args.out)!r}: vllm-adaptive writes two files; give a folder"
            )
        paths = to_vllm_adaptive(
            model,
            args.out,
            gamma=args.gamma,
            tokens=args.tokens,
            capture_max_tokens=args.capture_max_tokens,
            context_tokens=args.context,
            tokens_per_request=args.tokens_per_request,
            force=args.force,
        )
    elif args.format in ("trtllm", "sglang"):
        from specsim.sim.cost.profile_export import to_sglang, to_trtllm

        write = to_trtllm if args.format == "trtllm" else to_sglang
        if args.tokens_per_request != 1.0:  # their tables are priced per token batch only
            raise SpecsimError(
                f"--tokens-per-request applies to vllm-adaptive and table exports, not "
                f"{args.format}; leave it out"
            )
        paths = [
            write(
                model, args.out, tokens=args.tokens, context_tokens=args.context, force=args.force
            )
        ]
    else:
        contexts = [args.context]
        if args.contexts:
            from specsim.sim.cost.profile_csv import contexts as checked

            contexts = checked(args.contexts.split(","), "--contexts").tolist()
        paths = [
            to_table(
                model,
                args.out,
                tokens=args.tokens,
                contexts=contexts,
                tokens_per_request=args.tokens_per_request,
                force=args.force,
            )
        ]
    for p in paths:
        print(p)
    return 0


SHOW_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 65536)
SHOW_REQUESTS = (1, 4, 16, 64, 128, 256, 512)


def summary(model) -> dict:  # type: ignore[no-untyped-def]
    """What ``profile show`` prints: the step and draft costs at round sizes, the limits."""
    toks = [b for b in SHOW_TOKENS if b <= max(model.b_max, 1)]
    reqs = [r for r in SHOW_REQUESTS if r <= model.max_running]
    return {
        "name": model.name,
        "source": model.meta.get("source", ""),
        "built_as": model.meta.get("built_as"),
        "scheduler": model.meta.get("scheduler"),
        "fitted": model.meta.get("fitted"),
        "fit_residual": model.meta.get("fit_residual"),
        "interpolation": model.interpolation,
        "capture_max_tokens": model.capture_max_tokens,
        "table_points": int(model.batch_tokens.size),
        "b_max": model.b_max,
        "two_d": model.is_2d,
        "step_ms": {str(b): round(float(model.step_time(b)) * 1000, 4) for b in toks},
        "draft_ms_gamma7": {str(r): round(float(model.draft_ms(r, 7)), 4) for r in reqs},
        **model.scalars(),
    }


def summary_text(model) -> str:  # type: ignore[no-untyped-def]
    s = summary(model)
    lines = [f"{s['name']}: {s['source']}"]
    if s["built_as"]:
        lines.append(f"  built by: {s['built_as']} (steps and drafter; the scheduler added)")
    if s["scheduler"]:
        lines.append(f"  scheduler: {s['scheduler']}")
    if s["fitted"]:
        lines.append(f"  FITTED on your baseline ({s['fit_residual']}): {s['fitted']}")
    how = s["interpolation"] + (
        f" to {s['capture_max_tokens']} tokens, linear past"
        if s["interpolation"] == "step" and s["capture_max_tokens"]
        else ""
    )
    lines.append(
        f"  table: {s['table_points']} points up to {s['b_max']:,} tokens, {how}"
        + (" (x context)" if s["two_d"] else "")
    )
    lines.append("  step ms:  " + "  ".join(f"{b}:{v:.3g}" for b, v in s["step_ms"].items()))
    lines.append("  draft ms (block 7) by requests:  " + "  ".join(
        f"{r}:{v:.3g}" for r, v in s["draft_ms_gamma7"].items()))  # fmt: skip
    lines.append(
        f"  limits: max_running {s['max_running']}, kv_tokens {s['kv_tokens']:,}, "
        f"max_batched_tokens {s['max_batched_tokens']:,}, gpus {s['gpus']}"
    )
    return "\n".join(lines)


def run_show(args: argparse.Namespace) -> int:
    from specsim.sim.cost.profiles import get_profile

    model = get_profile(args.profile)
    if args.json:
        print(json.dumps(summary(model)))
    else:
        print(summary_text(model))
    return 0
