"""``specsim plot``: draw a figure from a sweep table (or, for calibration, from a trace).

specsim plot results.parquet --kind pareto --out pareto.png
specsim plot results.parquet --kind sla --sla 80,120 --baseline mtp1 --out sla.png
specsim plot results.parquet --kind load --out load.png
specsim plot traces/chat.parquet --kind calibration --out calibration.png
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specsim.errors import SpecsimError

# The figure kinds of ``specsim.analysis.plots.KINDS``, spelled out so ``--help`` needs no
# matplotlib or pandas (tests/test_cli_help.py keeps the two equal).
KINDS = ("pareto", "sla", "load", "calibration")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plot",
        help="draw pareto / sla / load figures from a sweep, or calibration from a trace",
        description=__doc__.split("\n")[0],
    )
    p.add_argument("input", metavar="FILE", help="sweep results (.parquet), or a trace")
    p.add_argument("--kind", required=True, choices=KINDS, help="which figure")
    p.add_argument("--out", required=True, help="figure file: .png, .svg or .pdf")
    p.add_argument("--sla", default=None, help="SLA targets in tok/s/user, e.g. 80,120 (sla)")
    p.add_argument("--baseline", default="mtp1", help="policy gains are measured against")
    p.add_argument("--trace", action="append", default=None, help="only this trace (repeatable)")
    p.add_argument("--title", default=None, help="figure title")
    p.add_argument("--force", action="store_true", help="overwrite --out")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.kind == "calibration":
        from specsim.trace.io import resolve_trace

        src = resolve_trace(args.input)  # a path or a shipped trace's name
    else:
        src = Path(args.input)
        if not src.is_file():
            raise SpecsimError(f"input file {args.input!r} does not exist; check the path")
    targets = None
    if args.sla:
        from specsim.analysis.grid import parse_numbers

        targets = parse_numbers(args.sla, "--sla")
        if min(targets) <= 0:
            raise SpecsimError(f"--sla {args.sla!r}: targets are per-user speeds, above 0 tok/s")
    from specsim.outputs import claim

    # before any drawing: a figure of minutes must not end in "cannot write"
    with claim(args.out, force=args.force, suffixes=(".png", ".svg", ".pdf")) as out:
        return _draw(args, src, out, targets)


def _draw(args: argparse.Namespace, src: Path, out: Path, targets: list[float] | None) -> int:
    from specsim.analysis.figures import figure, save_figure

    if args.kind == "calibration":
        from specsim.trace.io import read_trace

        data = read_trace(src)
    else:
        data = _read_results(src)
    baseline = None if args.baseline in ("", "none") else args.baseline
    fig = figure(
        args.kind, data, targets=targets, baseline=baseline, traces=args.trace, title=args.title
    )
    save_figure(fig, out, force=args.force)
    print(f"wrote {out}", file=sys.stderr)
    return 0


def _read_results(path: Path):
    import pandas as pd

    try:
        table = pd.read_parquet(path)
    except Exception as exc:  # noqa: BLE001 - any read failure is a bad input file
        raise SpecsimError(
            f"cannot read {path} as Parquet ({type(exc).__name__}); "
            "give the table written by specsim sweep"
        ) from None
    need = ("policy", "trace", "load", "throughput_per_gpu_tok_s", "per_user_tps_mean")
    missing = [c for c in need if c not in table.columns]
    if missing:
        raise SpecsimError(
            f"{path} is not a sweep table (no {', '.join(missing)} column); for "
            "--kind calibration give a trace, otherwise the output of specsim sweep"
        )
    if table.empty:
        raise SpecsimError(f"{path} has no rows; sweep at least one cell first")
    if table["policy"].isna().any() or table["trace"].isna().any():
        raise SpecsimError(f"{path}: some rows have no policy or trace; rewrite it with sweep")
    for col in need[2:]:
        if not pd.api.types.is_numeric_dtype(table[col]):
            raise SpecsimError(
                f"{path}: column {col!r} holds {table[col].dtype} values, not numbers; "
                "rewrite it with specsim sweep"
            )
    return table
