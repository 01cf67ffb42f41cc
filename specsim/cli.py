"""The ``specsim`` command line: a thin layer over functions a notebook can call too.

Each sub-command lives in ``specsim/commands/<name>.py`` and exposes ``register(subparsers)``,
which adds its parser and sets ``func`` to a ``run(args) -> int`` function. Modules are imported
lazily-cheap: none of them imports torch at module level.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from specsim.errors import SpecsimError

# Sub-command modules, in the order ``specsim --help`` lists them.
COMMANDS = (
    "replay",
    "traces",
    "check_lossless",
    "record",
    "sweep",
    "plot",
    "report",
    "engine",
    "validate",
    "bench",
)


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line (exit 2) instead of usage + error."""

    def format_help(self) -> str:
        """Help as plain text: the docstrings' reST literals (````x````) print as ``x``."""
        return super().format_help().replace("``", "")

    def format_usage(self) -> str:
        return super().format_usage().replace("``", "")

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message}; see '{self.prog} --help'\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="specsim",
        description="Schedule speculative decoding under load: record traces, replay them in a "
        "serving simulator under any prefix scheduler, prove schedulers lossless, plot.",
        epilog="Run 'specsim COMMAND --help' for a command's options. Docs: docs/ in the repo.",
    )
    from specsim import __version__

    parser.add_argument("--version", action="version", version=f"specsim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMANDS:
        try:
            mod = importlib.import_module(f"specsim.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"specsim.commands.{name}":
                continue  # not written yet
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except SpecsimError as exc:
        sys.stderr.write(f"specsim: error: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("specsim: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
