"""User-facing errors.

Every problem a user can fix (a bad file, a bad argument, a bad callable) is raised as a
:class:`SpecsimError` whose message is ONE line naming the problem and the fix. The CLI prints it
as ``specsim: error: <message>`` and exits with code 2, with no traceback. Library callers get
the exception and can catch it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NoReturn


class SpecsimError(Exception):
    """A problem in the user's input; the message is one line and says how to fix it."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


class TraceError(SpecsimError):
    """A trace file that does not follow trace format v1 (docs/trace-format.md)."""


class RunFailed(SpecsimError):
    """The run happened but did not measure what it was for (every request to a server failed,
    or more than the share the user allowed): exit 1, one line, what was measured kept."""

    exit_code = 1


class Interrupted(RunFailed):
    """A signal (Ctrl-C, SIGTERM) stopped a run that kept what it had measured: exit 128 plus
    the signal's number (130, 143), as a shell reports a process the signal killed."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.exit_code = 128 + int(signum)


class LineParser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line (exit 2) instead of usage + error: the
    rule for every command line of the project, the ``specsim`` CLI's and the scripts'."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message}; see '{self.prog} --help'\n")
        raise SystemExit(2)


def run_script(prog: str, body: Callable[[], int | None]) -> int:
    """Run a script's ``body``: a :class:`SpecsimError` (bad input, found before the work where
    it can be) is one line, ``PROG: error: ...``, and its exit code (2), never a traceback."""
    try:
        return int(body() or 0)
    except SpecsimError as exc:
        sys.stderr.write(f"{prog}: error: {exc}\n")
        return exc.exit_code


def whole(least: int, most: int) -> Callable[[str], int]:
    """An argparse ``type``: a whole number in [least, most], refused in one line otherwise
    (with :class:`LineParser`). The bound is what the option can use: a count past it is a typo
    that would run for hours, or loop forever, not a request."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not least <= value <= most:
            raise argparse.ArgumentTypeError(f"{value} is outside {least:,}..{most:,}")
        return value

    return parse
