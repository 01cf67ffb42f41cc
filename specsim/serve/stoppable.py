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
