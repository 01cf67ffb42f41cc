"""Await a client's work so that Ctrl-C or SIGTERM stops it and keeps what it measured.

One rule for every real-server command (``specsim bench``, ``check-lossless --server``): the
first SIGINT or SIGTERM cancels the work (the clients close on the way out) and is recorded,
so the caller writes what was measured and exits 128 + the signal; the handlers are removed at
once, so a second signal acts as it would without them. Where no handler can be installed (not
the main thread, no signal support) the work runs unprotected.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


async def await_stoppable(work: asyncio.Future, stopped: list[int]) -> None:
    """Await ``work``; a stop signal cancels it and is appended to ``stopped`` (the caller
    reads it after the event loop ends). Other cancellations propagate unchanged."""
    loop = asyncio.get_running_loop()

    def stop(signum: int) -> None:
        stopped.append(signum)
        for s in STOP_SIGNALS:  # a second signal: the default action, at once
            loop.remove_signal_handler(s)
        work.cancel()

    installed = []
    for s in STOP_SIGNALS:
        try:
            loop.add_signal_handler(s, stop, s)
            installed.append(s)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
            pass
    try:
        await work
    except asyncio.CancelledError:
        if not stopped:
            raise
    finally:
        if not stopped:
            for s in installed:
                loop.remove_signal_handler(s)


async def gather_all(coros: list[Any]) -> None:
    """Run the workers; on the first failure cancel the others and await them, so their own
    failures are retrieved here (not printed as 'Task exception was never retrieved' or a
    traceback at the loop's shutdown) and only the first reaches the user."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class AuditInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM stopped an audit: ``signum`` the signal, ``result`` what the audit
    had measured by then (None when nothing was). A KeyboardInterrupt, so a caller that does
    not keep the result stops as on Ctrl-C; ``check-lossless`` writes it and exits 128 + n."""

    def __init__(self, signum: int, result: Any = None) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum
        self.result = result


def run_stoppable(main: Any) -> int | None:
    """``asyncio.run(main)``, stopped cleanly by SIGINT or SIGTERM (as ``specsim bench`` is):
    the work is cancelled, the clients close, and the signal's number is returned (None when
    the work finished) so the caller keeps what was measured. A second signal acts as it
    would without this (the default handlers are back)."""
    stopped: list[int] = []

    async def wrapped() -> None:
        await await_stoppable(asyncio.ensure_future(main), stopped)

    asyncio.run(wrapped())
    return stopped[0] if stopped else None
