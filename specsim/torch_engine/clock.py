"""The real engine's clocks: wall time, or a virtual clock driven by the thread's CPU time.

Why a CPU clock: on a shared machine the wall-clock speed of a step moves by ~10% from minute
to minute with the neighbours' load, which is larger than the simulator errors worth measuring.
With torch at ONE thread every kernel runs on the calling thread, so that thread's CPU time is
what a dedicated core would have spent. The virtual clock advances by it and, when the engine is
idle (open loop, nothing to run), jumps to the next arrival instead of sleeping: TTFT, TPOT and
throughput are those of a core of our own. What remains (caches, memory bandwidth shared with a
neighbour) is measured by ``specsim validate --hog-check`` (docs/fidelity.md).

A GPU's work is not the host thread's CPU time, so the CPU clock refuses CUDA models.
"""

from __future__ import annotations

import time

from specsim.errors import SpecsimError

CLOCKS = ("wall", "cpu")


def check_clock(kind: str, device: str = "cpu", threads: int = 1) -> None:
    """One-line refusals for a clock that would not measure what it claims."""
    if kind not in CLOCKS:
        raise SpecsimError(f"unknown clock {kind!r}; use one of {', '.join(CLOCKS)}")
    if kind == "cpu" and device != "cpu":
        raise SpecsimError(
            "--clock cpu times the host thread, not the GPU; use --clock wall with --device cuda"
        )
    if kind == "cpu" and threads != 1:
        raise SpecsimError(
            f"--clock cpu needs --threads 1 (one thread does all compute), got {threads}"
        )


def timer(kind: str):  # type: ignore[no-untyped-def]
    """A ``() -> seconds`` counter: ``perf_counter`` (wall) or ``thread_time`` (cpu)."""
    check_clock(kind)
    return time.thread_time if kind == "cpu" else time.perf_counter


class EngineClock:
    """Seconds since :meth:`start` on the engine's time axis, and how to wait for an arrival.

    ``wall``: real time; waiting sleeps. ``cpu``: the thread's CPU time plus every idle jump;
    waiting jumps. :meth:`wall` always gives real seconds since start (logged beside).
    """

    def __init__(self, kind: str = "wall") -> None:
        check_clock(kind)
        self.kind = kind
        self._count = timer(kind)
        self._t0 = self._w0 = 0.0
        self._skew = 0.0

    def start(self) -> None:
        self._t0 = self._count()
        self._w0 = time.perf_counter()
        self._skew = 0.0

    def now(self) -> float:
        return self._count() - self._t0 + self._skew

    def wall(self) -> float:
        return time.perf_counter() - self._w0

    def wait_until(self, t: float) -> None:
        """Idle until engine time ``t`` (no-op if it has passed)."""
        gap = t - self.now()
        if gap <= 0:
            return
        if self.kind == "cpu":
            self._skew += gap
        else:
            time.sleep(gap)
