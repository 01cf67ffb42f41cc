"""The real engine's clocks: wall time, a virtual clock of the thread's CPU time, and that CPU
time at a reference speed.

Why a CPU clock: on a shared machine the wall-clock speed of a step moves by ~10% from minute
to minute with the neighbours' load, which is larger than the simulator errors worth measuring.
With torch at ONE thread every kernel runs on the calling thread, so that thread's CPU time is
what a dedicated core would have spent. The virtual clock advances by it and, when the engine is
idle (open loop, nothing to run), jumps to the next arrival instead of sleeping: TTFT, TPOT and
throughput are those of a core of our own.

Why a reference clock (``ref``): on a VM the core's own speed moves too. The fidelity grid of
30 Nov 2026 saw one fixed forward take up to 42% more CPU time late in the hour than at
profiling, on a quiet VM (the host's other tenants: caches, memory bandwidth), and the drafter
slowed less than the target forward (compute-bound against memory-bound). ``ref`` is the CPU
clock divided by the current speed of the kind of work being timed: every ``every_s`` seconds
of engine CPU time a :class:`SpeedRef` re-times a fixed piece of each kind of work (a target
forward; the drafter's proposal) and a phase's CPU time is divided by its probe's slowdown
against the start. The probes' own time is excluded from both clocks. Times are then "CPU time
at the speed the machine had when the reference was taken", for the profile and the engine
alike (one reference per process: :func:`use_reference`).

A GPU's work is not the host thread's CPU time, so the CPU clocks refuse CUDA models.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable

from specsim.errors import SpecsimError

CLOCKS = ("wall", "cpu", "ref")


def check_clock(kind: str, device: str = "cpu", threads: int = 1) -> None:
    """One-line refusals for a clock that would not measure what it claims."""
    if kind not in CLOCKS:
        raise SpecsimError(f"unknown clock {kind!r}; use one of {', '.join(CLOCKS)}")
    if kind != "wall" and device != "cpu":
        raise SpecsimError(
            f"--clock {kind} times the host thread, not the GPU; use --clock wall with "
            "--device cuda"
        )
    if kind != "wall" and threads != 1:
        raise SpecsimError(
            f"--clock {kind} needs --threads 1 (one thread does all compute), got {threads}"
        )


def timer(kind: str):  # type: ignore[no-untyped-def]
    """A ``() -> seconds`` counter: ``perf_counter`` (wall) or ``thread_time`` (cpu, ref)."""
    check_clock(kind)
    return time.perf_counter if kind == "wall" else time.thread_time


# How a calibration times a probe: "warm", a warm-up call then the timed one (v3-v5); "cold", one
# timed call right after the engine's work: it follows the VM better (spread of 15-s means 6.4%
# against 9.8%) at half the probes' cost, and costs 1.007x a warm call (bench_speed_ref.py).
PROBE_KINDS = ("cold", "warm")

# The second target probe (``--ref-large``): a large forward, for the forwards that a 4-token
# probe does not stand for. In v6's grid a verification of 32-64 tokens came out 6% over the
# model, and more so in the runs whose small probe said the core was fast: within a cell, the
# repeat with the lower speed factor had the larger error (slope -0.58 per unit of factor at
# 32-64 tokens, -0.27 at 8-32, +0.11 at <= 8; docs/fidelity.md). Large forwards do not speed up
# as much as a small one, so dividing them by the small probe's factor over-corrects.
LARGE = "target:large"
MID = "target:mid"  # an optional third, between the two (``--ref-mid``)


class SpeedRef:
    """The machine's current speed for each kind of work, against a reference taken once.

    ``probes`` maps a phase name ("target", "draft", ...) to a fixed piece of that work. Each
    calibration times every probe once on the thread's CPU clock (``probe="cold"``, right after
    the engine's work) or runs it twice and times the second call (``"warm"``); a phase's
    factor is the median of its last ``window`` ratios to the reference.

    Sized target probes (``"target:<name>"``, e.g. :data:`LARGE`; ``sizes`` gives every target
    probe's tokens, the plain ``"target"`` the smallest) time target forwards by their size:
    each keeps ``r``, its factor over the small probe's at the same calibration (the median of
    the last ``window``), and a forward of ``tokens`` tokens runs at ``f * exp(g)``, ``f`` the
    small probe's factor and ``g`` the log ``r`` interpolated in log tokens between the probes'
    sizes (0 at the small probe's, clipped beyond the largest). With one large probe that is
    ``f * r ** w``, ``w = log(tokens / small) / log(large / small)`` in [0, 1]. The sized
    probes are re-timed at every ``large_every``-th calibration only (each costs several small
    ones); between those their ratios carry, so large forwards still follow the small probe.

    :meth:`calibrate` returns the CPU and wall seconds it spent, which the clocks exclude. The
    defaults re-time every engine CPU second and use the latest ratio because the shared VM's
    speed moved by up to 25% within seconds: a 5-second cadence with a median of 5 lagged it
    and corrected a 15-s mean worse than no correction at all (``studies/bench_speed_ref.py``,
    docs/fidelity.md).
    """

    def __init__(
        self,
        probes: dict[str, Callable[[], None]],
        every_s: float = 1.0,
        window: int = 1,
        probe: str = "warm",
        sizes: dict[str, int] | None = None,
        large_every: int = 4,
    ) -> None:
        if "target" not in probes:
            raise SpecsimError("a speed reference needs a 'target' probe")
        if probe not in PROBE_KINDS:
            raise SpecsimError(f"probe kind {probe!r} is not one of: {', '.join(PROBE_KINDS)}")
        self.sizes = dict(sizes or {})
        self.sized = sorted(
            (p for p in probes if p.startswith("target:")), key=lambda p: self.sizes.get(p, 0)
        )  # the sized target probes, smallest first
        small = self.sizes.get("target", 0)
        toks = [self.sizes.get(p, 0) for p in self.sized]
        if self.sized and not (1 <= small < toks[0] and len(set(toks)) == len(toks)):
            raise SpecsimError(
                f"sized target probes {self.sized} need sizes with more tokens than the "
                "'target' probe's, each a different count"
            )
        if large_every < 1:
            raise SpecsimError(f"large_every must be at least 1, got {large_every}")
        self.large_every = int(large_every)
        self.ratio = {p: 1.0 for p in self.sized}  # each sized probe's factor over the small's
        self.probe = probe
        self.probes = dict(probes)
        self.every_s = float(every_s)
        self.ref_ms: dict[str, float] = {}
        self._hist: dict[str, deque[float]] = {p: deque(maxlen=window) for p in self.probes}
        self.factor: dict[str, float] = {p: 1.0 for p in self.probes}
        self.calibrations = 0
        self._next = 0.0
        self.spent_cpu_s = 0.0
        self.repeat_k: dict[str, int] = {}  # a cheap drafter probe's calls (speed_reference)

    @property
    def large_ratio(self) -> float:
        """The largest sized probe's factor over the small one's (1 without one)."""
        return self.ratio[self.sized[-1]] if self.sized else 1.0

    @staticmethod
    def _time(fn: Callable[[], None], repeats: int) -> float:
        vals = []
        for _ in range(repeats):
            fn()  # the warm-up call before each timed one
            c0 = time.thread_time()
            fn()
            vals.append((time.thread_time() - c0) * 1000.0)
        return statistics.median(vals)

    def reference(self, repeats: int = 7) -> dict[str, float]:
        """Take the reference: each probe's median CPU ms over ``repeats`` warm calls."""
        c0 = time.thread_time()
        self.ref_ms = {p: self._time(fn, repeats) for p, fn in self.probes.items()}
        self.factor = {p: 1.0 for p in self.probes}
        self.ratio = {p: 1.0 for p in self.sized}
        self._next = time.thread_time() + self.every_s
        self.spent_cpu_s += time.thread_time() - c0
        return dict(self.ref_ms)

    def adopt(self, ref_ms: dict[str, float]) -> None:
        """Take another process's reference instead of timing one: a worker of a grid run on
        several cores (``validate --workers``) times its runs in the units of the profile the
        parent measured. Its probes must be the same work (same seeds and sizes,
        ``speed_reference(..., like=...)``); its first calibration gives its own speed."""
        if set(ref_ms) != set(self.probes):
            raise SpecsimError(
                f"a reference for probes {sorted(ref_ms)} does not fit probes {sorted(self.probes)}"
            )
        self.ref_ms = dict(ref_ms)
        self.factor = {p: 1.0 for p in self.probes}
        self.ratio = {p: 1.0 for p in self.sized}
        self.calibrations = 0
        self._next = 0.0  # due at once

    def due(self) -> bool:
        return time.thread_time() >= self._next

    def calibrate(self, phases: tuple[str, ...] | None = None) -> tuple[float, float]:
        """Re-time the probes of ``phases`` (default: all; the target's always, the sized ones
        at every ``large_every``-th call) once and update their factors. Returns the (cpu s,
        wall s) spent."""
        if not self.ref_ms:
            self.reference()
        c0, w0 = time.thread_time(), time.perf_counter()
        # in the probes' own order (a set's order would vary between processes), the small
        # target probe before the sized ones (their ratios are to it)
        todo = [
            p
            for p in self.probes
            if p not in self.sized and (phases is None or p == "target" or p in phases)
        ]
        if self.calibrations % self.large_every == 0:
            todo += self.sized
        small = 1.0  # the small target probe's ratio at this calibration
        for p in todo:
            fn = self.probes[p]
            if self.probe == "cold":  # one call right after the engine's own work
                c1 = time.thread_time()
                fn()
                ms = (time.thread_time() - c1) * 1000.0
            else:
                ms = self._time(fn, 1)
            if p in self.ratio:  # kept as its ratio to the small probe of this calibration
                self._hist[p].append(ms / self.ref_ms[p] / small)
                self.ratio[p] = statistics.median(self._hist[p])
                continue
            if p == "target":
                small = ms / self.ref_ms[p]
            self._hist[p].append(ms / self.ref_ms[p])
            self.factor[p] = statistics.median(self._hist[p])
        for p in self.sized:
            self.factor[p] = self.factor["target"] * self.ratio[p]
        self.calibrations += 1
        cpu, wall = time.thread_time() - c0, time.perf_counter() - w0
        self._next = time.thread_time() + self.every_s
        self.spent_cpu_s += cpu
        return cpu, wall

    def speed(self, phase: str, tokens: int | None = None) -> float:
        """The current factor of ``phase`` (> 1: slower than at the reference); a phase without
        a probe of its own runs at the target's. A target forward of ``tokens`` tokens is
        blended towards the sized probes' factors (class docstring)."""
        f = self.factor.get(phase, self.factor["target"])
        if tokens is None or phase != "target" or not self.sized:
            return f
        xs = [math.log(self.sizes["target"])] + [math.log(self.sizes[p]) for p in self.sized]
        gs = [0.0] + [math.log(self.ratio[p]) for p in self.sized]
        x = math.log(max(tokens, 1))
        if x <= xs[0]:
            return f
        for i in range(1, len(xs)):
            if x <= xs[i]:
                w = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
                return f * math.exp(gs[i - 1] + w * (gs[i] - gs[i - 1]))
        return f * math.exp(gs[-1])


_ACTIVE: list[SpeedRef] = []


def use_reference(ref: SpeedRef | None) -> None:
    """Make ``ref`` THE reference of this process (the profile and every engine run share it,
    so their times are in the same units); ``None`` clears it."""
    _ACTIVE.clear()
    if ref is not None:
        _ACTIVE.append(ref)


def active_reference() -> SpeedRef | None:
    return _ACTIVE[0] if _ACTIVE else None


def ref_cpu_ms(cpu_ms: float, phase: str = "target", tokens: int | None = None) -> float:
    """CPU ms at the active reference's speed for ``phase`` (a target forward: of ``tokens``
    tokens); unchanged without one."""
    ref = active_reference()
    return cpu_ms / ref.speed(phase, tokens) if ref is not None else cpu_ms


class EngineClock:
    """Seconds since :meth:`start` on the engine's time axis, and how to wait for an arrival.

    ``wall``: real time; waiting sleeps. ``cpu``: the thread's CPU time plus every idle jump;
    waiting jumps. ``ref``: as ``cpu``, each phase's CPU time divided by its current speed
    factor (:class:`SpeedRef`), calibrations excluded. :meth:`wall` always gives real seconds
    since start (logged beside), calibrations excluded.
    """

    def __init__(
        self, kind: str = "wall", ref: SpeedRef | None = None, phases: tuple[str, ...] = ()
    ) -> None:
        check_clock(kind)
        if kind == "ref" and ref is None:
            raise SpecsimError("--clock ref needs a speed reference (SpeedRef)")
        self.kind = kind
        self.ref = ref if kind == "ref" else None
        self._phases = ("target", *phases)  # the probes this engine's work needs
        self._count = timer(kind)
        self._t0 = self._w0 = 0.0
        self._skew = 0.0
        self._acc = 0.0  # ref: normalised seconds up to the current segment
        self._seg = 0.0  # ref: raw thread time at which the current segment began
        self._phase = "target"
        self._tokens: int | None = None  # a target forward's tokens (the large probe's blend)
        self._excl_w = 0.0
        self.raw_cpu_s = 0.0  # ref: raw CPU seconds counted (for the run's mean factor)
        self.calibrations = 0

    def start(self) -> None:
        if self.ref is not None:
            self.ref.calibrate(self._phases)  # a fresh speed at every run's start
        self._t0 = self._count()
        self._w0 = time.perf_counter()
        self._skew = self._acc = self.raw_cpu_s = self._excl_w = 0.0
        self._seg = self._t0
        self._tokens = None

    def now(self) -> float:
        if self.ref is None:
            return self._count() - self._t0 + self._skew
        raw = self._count() - self._seg
        return self._acc + raw / self.ref.speed(self._phase, self._tokens) + self._skew

    def mark(self, phase: str, tokens: int | None = None) -> float:
        """Now, and from here on time ``phase``'s work (ref clock; a plain read otherwise): for
        a target forward, of ``tokens`` tokens (``SpeedRef.speed``)."""
        t = self.now()
        if self.ref is not None:
            c = self._count()
            self.raw_cpu_s += c - self._seg
            self._acc = t - self._skew
            self._seg = c
            self._phase = phase
            self._tokens = tokens
        return t

    def tick(self) -> None:
        """Between steps: re-time the probes when due, outside both clocks."""
        if self.ref is None or not self.ref.due():
            return
        self.mark(self._phase, self._tokens)
        _, wall = self.ref.calibrate(self._phases)
        self.calibrations += 1
        self._seg = self._count()
        self._excl_w += wall

    @property
    def skew(self) -> float:
        """Seconds the clock jumped while idle (open loop)."""
        return self._skew

    def wall(self) -> float:
        return time.perf_counter() - self._w0 - self._excl_w

    def wait_until(self, t: float) -> None:
        """Idle until engine time ``t`` (no-op if it has passed)."""
        gap = t - self.now()
        if gap <= 0:
            return
        if self.kind != "wall":
            self._skew += gap
        else:
            time.sleep(gap)
