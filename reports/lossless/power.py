"""Measure the statistical path per world (issue #12): planned samples, floor TV, the empirical
power of the sequential test at TV 1e-3 (least favourable direction), sampler speed, and a
false-alarm stress of correct pipelines. Run from the repository root:

    ../shared/bin/alone python reports/lossless/power.py > reports/lossless/power.md
"""

from __future__ import annotations

import time

import numpy as np

from specsim.lossless.check import CROSS_CHECK, N_CAP, check_pipeline, standard_worlds
from specsim.lossless.mutants import correct_pipelines
from specsim.lossless.pipeline import Pipeline
from specsim.lossless.sampling import BlockSampler
from specsim.lossless.stats import alpha_per_look, effective_df, planned_n, sequential_test

REPS = 200


def least_favourable(probs: np.ndarray, tv: float) -> np.ndarray:
    """Move ``tv`` of mass from the cells with the most mass to the rest, proportionally: the
    direction in which the chi-square divergence for a given TV is smallest-ish."""
    order = np.argsort(-probs)
    half = np.zeros(probs.shape[0], dtype=bool)
    half[order[: max(1, int((probs > 0).sum()) // 2)]] = True
    alt = probs.copy()
    alt[half] -= tv * probs[half] / probs[half].sum()
    rest = ~half & (probs > 0)
    alt[rest] += tv * probs[rest] / probs[rest].sum()
    return alt


def main() -> None:
    worlds = standard_worlds(0)
    alpha = alpha_per_look(len(worlds))
    print("| world | cells | df | planned n | floor TV | power at TV 1e-3 | samples/s |")
    print("|---|---|---|---|---|---|---|")
    pipe = Pipeline(name="rejection + full")
    for w in worlds:
        s = BlockSampler(w, pipe, 0)
        df = effective_df(s.probs, N_CAP)
        n = min(N_CAP, max(CROSS_CHECK, planned_n(df, alpha)))
        alt = least_favourable(s.probs, 1e-3)
        rng = np.random.default_rng(1)
        hits = 0
        for _ in range(REPS):
            total = {"n": 0, "c": np.zeros_like(s.probs, dtype=np.int64)}

            def counts_at(m, total=total, rng=rng, alt=alt):
                total["c"] += rng.multinomial(m - total["n"], alt)
                total["n"] = m
                return total["c"].copy()

            res = sequential_test(counts_at, s.probs, n, alpha)
            hits += not res.passed
        t = time.perf_counter()
        s.counts(2_000_000)
        rate = 2_000_000 / (time.perf_counter() - t)
        print(f"| {w.name} | {s.probs.shape[0]} | {df} | {n:,} | {res.floor_tv:.2e} | "
              f"{hits}/{REPS} | {rate / 1e6:.2f}M |")  # fmt: skip
    print()
    print(
        "Time of a statistical-only run (every world on its full plan, no early stop): "
        "`my_verifier:verify_rng`, which draws its own uniforms"
    )
    print()
    import sys

    sys.path.insert(0, "examples/lossless")
    from specsim.lossless.user import verifier_pipeline

    t = time.perf_counter()
    df = check_pipeline(verifier_pipeline("my_verifier:verify_rng"), progress=False)
    print(
        f"{time.perf_counter() - t:.0f} s, {int(df['n'].sum()):,} samples, "
        f"verdicts: {', '.join(df['status'])}"
    )
    print()
    print(
        "Mutants with TV >= 1e-3 in some world, statistical check only (full plan, stops at "
        "the first world and look that rejects):"
    )
    print()
    from specsim.lossless.mutants import by_name

    names = ["band-in-cell-1e-2", "band-3e-3-recovered-only", "reject-when-u-below-1e-3",
             "flip-when-v-below-1e-3", "fixed-point-uniforms", "band-in-cell-1e-3"]  # fmt: skip
    for name in names:
        t = time.perf_counter()
        df = check_pipeline(by_name(name).pipeline, checks=("statistical",),
                            stop_at_first_failure=True, progress=False)  # fmt: skip
        bad = df[~df["lossless"]]
        where = (
            f"caught in {bad.iloc[0]['world']} after {int(bad.iloc[0]['n']):,}"
            if len(bad)
            else "NOT caught"
        )
        print(f"- `{name}`: {where} samples, {time.perf_counter() - t:.0f} s")
    print()
    print("False-alarm stress: correct pipelines, statistical checks only, 300,000 samples a world")
    print()
    total = fails = 0
    t = time.perf_counter()
    for seed in range(1, 11):
        for pipe in correct_pipelines():
            df = check_pipeline(pipe, seed=seed, samples=300_000, checks=("statistical",),
                                progress=False)  # fmt: skip
            total += len(df)
            fails += int((~df["lossless"]).sum())
    print(
        f"seeds 1-10, {len(correct_pipelines())} pipelines: {fails} false alarms in {total} "
        f"sequential tests ({time.perf_counter() - t:.0f} s)"
    )


if __name__ == "__main__":
    main()
