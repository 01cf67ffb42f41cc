"""User-facing errors.

Every problem a user can fix (a bad file, a bad argument, a bad callable) is raised as a
:class:`SpecsimError` whose message is ONE line naming the problem and the fix. The CLI prints it
as ``specsim: error: <message>`` and exits with code 2, with no traceback. Library callers get
the exception and can catch it.
"""

from __future__ import annotations


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
