"""``specsim engine``: retired. It served prompts with specsim's own torch engine
(``specsim/torch_engine/``) and logged every step; llama-server is the independent reference
now. Its record (reports/fidelity) is kept as it was made, and it runs from commit 574e4c8.

The command stays registered so an old script gets one line saying so (exit 2), not argparse's
"invalid choice": every argument is taken as it comes and none is read.
"""

from __future__ import annotations

import argparse

from specsim.errors import SpecsimError

RETIRED_AT = "574e4c8"  # the last commit that runs the torch engine
REFUSAL = (
    "specsim engine (specsim's own torch engine) was retired (llama-server is the independent "
    "reference); use specsim replay to simulate, specsim validate --engine llama-server or "
    f"specsim bench against a real server, or run it from commit {RETIRED_AT}"
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "engine",
        help=f"retired (specsim's own torch engine; runs from commit {RETIRED_AT})",
        description=REFUSAL + ".",
        add_help=False,  # --help is read in run: every argument reaches it as it was typed
        prefix_chars="\0",  # no argument is an option: an old engine flag is not refused here
    )
    p.add_argument("args", nargs="*", metavar="...", help=argparse.SUPPRESS)
    p.set_defaults(func=run, help_text=p.format_help)


def run(args: argparse.Namespace) -> int:
    if args.args in (["-h"], ["--help"]):
        print(args.help_text(), end="")
        return 0
    raise SpecsimError(REFUSAL)
