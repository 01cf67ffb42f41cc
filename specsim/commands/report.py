"""``specsim report NAME``: regenerate ``reports/NAME/`` (README.md, figures, results table)
from the ``config.toml`` committed in that folder.

    specsim report schedulers-under-load
    specsim report zos
    specsim report lossless
"""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="regenerate reports/NAME/ (README, figures, tables) from its config.toml",
        description=__doc__.split("\n")[0],
    )
    p.add_argument("name", nargs="?", help="report folder name; omit to list them")
    p.add_argument(
        "--root", default="reports", help="folder holding the reports (default %(default)s)"
    )
    p.add_argument("--workers", type=int, default=None, help="local processes (default: CPUs)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="reuse unchanged cells of results.parquet (only when the code is unchanged)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from specsim.analysis.report import list_reports, run_report
    from specsim.commands.common import plain_warnings

    if not args.name:
        for name in list_reports(Path(args.root)):
            print(name)
        return 0
    with plain_warnings():  # a sweep's warning: one line, with how many cells said it
        readme = run_report(args.name, args.root, workers=args.workers, resume=args.resume)
    print(f"wrote {readme}", file=sys.stderr)
    return 0
