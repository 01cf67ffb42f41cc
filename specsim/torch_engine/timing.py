"""How the engine's cost calibration times a call: medians of repeated timed calls on the
engine's clock (wall, CPU or the speed reference's), pairs timed back to back against an anchor
shape, the speed probe re-timed around a run, and flat against padded verification layouts."""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from specsim.torch_engine.clock import active_reference, ref_cpu_ms
from specsim.torch_engine.speed import _fill, _forward_probe, _ids, _sync
from specsim.torch_engine.target import FlatTarget


def _timed(  # type: ignore[no-untyped-def]
    fn, phase: str = "target", calibrate: bool = True, tokens: int | None = None
) -> tuple[float, float]:
    """(cpu ms, wall ms) of one call: the thread's CPU time and the wall clock, together. With a
    speed reference active (``--clock ref``) the CPU ms are at its reference speed for
    ``phase`` (a target forward: of ``tokens`` tokens, as the engine times its own), and the
    probes are re-timed first when due (outside the call) unless ``calibrate`` is False (the
    second call of a pair: both at the same speed factor)."""
    ref = active_reference()
    if calibrate and ref is not None and ref.due():
        ref.calibrate(("target", phase))
    c0, w0 = time.thread_time(), time.perf_counter()
    fn()
    cpu, wall = (time.thread_time() - c0) * 1000.0, (time.perf_counter() - w0) * 1000.0
    return ref_cpu_ms(cpu, phase, tokens), wall


def _median_ms(fn, repeats: int, clock: str = "wall") -> float:  # type: ignore[no-untyped-def]
    return _median2(fn, repeats)[0 if clock != "wall" else 1]


def _median2(fn, repeats: int, phase: str = "target") -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """Median (cpu ms, wall ms) over ``repeats`` calls after one warm-up."""
    fn()  # warm-up
    vals = [_timed(fn, phase) for _ in range(repeats)]
    return statistics.median(v[0] for v in vals), statistics.median(v[1] for v in vals)


def _paired_diff(  # type: ignore[no-untyped-def]
    a, b, repeats: int, ci: int, tokens: int | None = None
) -> float:
    """Median over ``repeats`` alternating pairs of (time of ``a`` - time of ``b``), in ms on
    the clock ``ci`` indexes (0: the CPU or reference clock, 1: wall), after one warm-up pair;
    both are target forwards of ``tokens`` tokens."""
    a()
    b()
    diffs = []
    for _ in range(repeats):
        ta = _timed(a, tokens=tokens)[ci]
        diffs.append(ta - _timed(b, calibrate=False, tokens=tokens)[ci])  # one factor a pair
    return float(statistics.median(diffs))


def _anchor_scaled(
    anchor: tuple[int, int],
    anchor_t: list[tuple[float, float]],
    ratios: dict[tuple[int, int], list[tuple[float, float]]],
) -> dict[tuple[int, int], list[float]]:
    """Each point's (cpu, wall) ms: the median of its (point / anchor) pair ratios times the
    anchor's median over all pairs. A speed shared by the two calls of a pair cancels in the
    ratio, so the points keep their true proportions however the machine's speed moves between
    pairs; the anchor's own value is the median of its timings, not a self-ratio."""
    a_med = [statistics.median(v[i] for v in anchor_t) for i in (0, 1)]
    med = {
        pt: [a_med[i] * statistics.median(v[i] for v in r) for i in (0, 1)]
        for pt, r in ratios.items()
    }
    if anchor in med:
        med[anchor] = a_med
    return med


# probe_ms's probes for one (model, points, seed): the last one asked for (the key's model id
# stays valid while the probes, which hold the model, are kept)
_PROBES: dict[str, Any] = {}


def probe_ms(
    model: Any,
    points: tuple[tuple[int, int], ...],
    repeats: int = 3,
    seed: int = 1,
    clock: str = "wall",
):
    """Median ms of single-request forwards at (context, batch) points: re-timed during a long
    validation to see how much faster or slower the (shared) machine is than at profiling.
    The probes (their caches filled once) are kept for the next call with the same model,
    points and seed: a grid calls this before and after each of its ~140 runs, and filling the
    128-token context took 0.55 s of the 1.25 s a call cost (1 Dec 2026)."""
    key = (id(model), tuple(points), seed)
    if _PROBES.get("key") != key:
        gen = np.random.default_rng(seed)
        vocab = int(model.config.vocab_size)
        _PROBES.update(key=key, fns=[_forward_probe(model, c, b, gen, vocab) for c, b in points])
    return [_median_ms(fn, repeats, clock) for fn in _PROBES["fns"]]


def compare_layouts(
    model: Any,
    lens: tuple[int, ...] = (1, 3, 5, 8, 2, 6, 1, 4),
    context: int = 128,
    repeats: int = 5,
    seed: int = 0,
    clock: str = "wall",
) -> dict[str, float]:
    """Median ms of one verification forward of requests verifying ``lens`` tokens each, flat
    against padded (same model, same cache contents)."""
    gen = np.random.default_rng(seed)
    vocab = int(model.config.vocab_size)
    out = {}
    for layout in ("flat", "padded"):
        ft = FlatTarget(model, len(lens), context + max(lens) + 1, (), layout)
        for s in range(len(lens)):
            _fill(ft, s, context, gen, vocab)
        toks = [_ids(gen, vocab, n).tolist() for n in lens]

        def step(ft=ft, toks=toks) -> None:
            ft.forward(list(range(len(toks))), toks)
            _sync(model)
            for s in range(len(toks)):
                ft.truncate(s, context)

        out[layout] = _median_ms(step, repeats, clock)
    out["tokens"] = float(sum(lens))
    out["requests"] = float(len(lens))
    out["padded_rows"] = float(len(lens) * max(lens))
    return out
