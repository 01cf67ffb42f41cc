"""Where a fidelity grid's time goes outside its real runs: the two profiles, part by part, and
the speed probe re-timed around every run (needs torch and the shipped SmolLM2).

``specsim validate``'s ``config.json`` has the grid's phases (``phases_s``: loading, speed
reference, traces and profiles, layouts and the simulated side, hog check, the real runs).
This splits the largest phase that is not a run: it takes the grid's speed reference, then
measures the two drafters' profiles exactly as the grid does (``--contexts 32,128,256
--profile-repeats 3``, the first drafter's table timed with both drafters' passes and shared),
timing the table, the loop-overhead calibration runs, the paired per-request splits, the cache
fills and the drafting medians; then it times ``profile.probe_ms`` (the forward re-timed before
and after each run) twice, to show what keeping its probe between calls saves.

    python studies/fidelity_grid_time.py   # on a quiet machine
"""

from __future__ import annotations

import functools
import time

import numpy as np

import specsim.torch_engine.cost_calibration as prof
from specsim.fidelity.real import _STATE, PROBE_POINTS
from specsim.fidelity.real import init_worker as _init_worker
from specsim.policies.base import get_policy
from specsim.torch_engine.clock import use_reference
from specsim.torch_engine.speed import speed_reference
from specsim.torch_engine.timing import probe_ms
from specsim.trace.io import read_trace

DRAFTERS = ("dspark", "ngram")
PARTS = ("_time_table", "_loop_overhead", "_paired_diff", "_fill", "_median2")


def timed_parts(acc: dict[str, float]) -> None:
    """Wrap the profile's parts so that their wall seconds add up in ``acc``."""
    for name in PARTS:
        fn = getattr(prof, name)

        @functools.wraps(fn)
        def wrapper(*a, _fn=fn, _name=name, **k):  # type: ignore[no-untyped-def]
            w = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                acc[_name] = acc.get(_name, 0.0) + time.perf_counter() - w

        setattr(prof, name, wrapper)


def main() -> None:
    acc: dict[str, float] = {}
    timed_parts(acc)
    _init_worker("smollm2", list(DRAFTERS), "cpu", 1)
    model = _STATE["target"].model
    ref = speed_reference(
        model,
        {f"draft:{d}": _STATE["proposers"][d] for d in DRAFTERS},
        probe="cold",
        large_tokens=64,
    )
    use_reference(ref)
    shared = None
    print("| profile | wall s | probes CPU-s | " + " | ".join(PARTS) + " |")
    print("|---" * (3 + len(PARTS)) + "|")
    for d in DRAFTERS:
        tr = read_trace(f"reports/fidelity/trace-mix16-{d}.parquet")
        acc.clear()
        w, c0 = time.perf_counter(), ref.spent_cpu_s
        p = prof.measure_profile(
            model,
            _STATE["proposers"][d],
            get_policy("hw-aware"),
            name=f"time-{d}",
            contexts=(32, 128, 256),
            requests=(1, 2, 4, 8, 16),
            draft_context=int(np.median(tr.prompt_len + tr.output_len // 2)),
            repeats=3,
            clock="ref",
            draft_phase=f"draft:{d}",
            table=shared,
            table_repeats=3 * len(DRAFTERS),
        )
        shared = shared or p
        parts = " | ".join(f"{acc.get(n, 0.0):.1f}" for n in PARTS)
        print(
            f"| {d} | {time.perf_counter() - w:.1f} | {ref.spent_cpu_s - c0:.1f} | {parts} |",
            flush=True,
        )
    for call in ("first (builds the probe)", "second (keeps it)"):
        w = time.perf_counter()
        probe_ms(model, PROBE_POINTS, clock="ref")
        print(f"probe_ms, {call}: {time.perf_counter() - w:.2f} s")


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    main()
