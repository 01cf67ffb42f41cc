"""Measure the statistical path per world (issues #12, #36): planned samples, floor TV, the
empirical power of the sequential test at TV 1e-3 (least favourable direction, in every
stratum), sampler speed, and what it catches without the exact check. Run from the repository
root on a quiet machine (the numbers are CPU-bound; note the load average next to them):

    python reports/lossless/power.py > reports/lossless/power.md
"""

from __future__ import annotations

import sys
import time

import numpy as np

from specsim.lossless.check import CROSS_CHECK, N_CAP, check_pipeline, standard_worlds
from specsim.lossless.mutants import by_name, correct_pipelines
from specsim.lossless.pipeline import Pipeline
from specsim.lossless.sampling import BlockSampler
from specsim.lossless.stats import alpha_per_look, effective_df, planned_n, sequential_test

REPS = 200
FALSE_ALARM_SEEDS = range(1, 6)


def least_favourable(probs: np.ndarray, tv: float) -> np.ndarray:
    """Move ``tv`` of mass from the cells with the most mass to the rest, proportionally, in
    every stratum (row): the direction in which the chi-square divergence for a given TV is
    smallest-ish."""
    out = probs.copy()
    for s, row in enumerate(probs):
        order = np.argsort(-row)
        half = np.zeros(row.shape[0], dtype=bool)
        half[order[: max(1, int((row > 0).sum()) // 2)]] = True
        rest = ~half & (row > 0)
        if not rest.any():
            continue
        out[s, half] -= tv * row[half] / row[half].sum()
        out[s, rest] += tv * row[rest] / row[rest].sum()
    return out


def power_rows() -> None:
    worlds = standard_worlds(0)
    alpha = alpha_per_look(len(worlds))
    print("| world | contexts x cells | df (plan) | planned n | floor TV | power at TV 1e-3 | "
          "blocks/s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    pipe = Pipeline(name="rejection + full")
    for w in worlds:
        s = BlockSampler(w, pipe, 0)
        df = effective_df(s.probs, N_CAP)
        n = min(N_CAP, max(CROSS_CHECK, planned_n(df, alpha)))
        t = time.process_time()
        pilot = s.counts(2_000_000)
        rate = 2_000_000 / (time.process_time() - t)
        weights = pilot.sum(axis=1) / pilot.sum()
        alt = least_favourable(s.probs, 1e-3)
        rng = np.random.default_rng(1)
        hits = 0
        res = None
        for _ in range(REPS):
            total = {"n": 0, "c": np.zeros(s.probs.shape, dtype=np.int64)}

            def counts_at(m, total=total, rng=rng, alt=alt, weights=weights):
                per = rng.multinomial(m - total["n"], weights)
                total["c"] += np.stack(
                    [rng.multinomial(k, a) for k, a in zip(per, alt, strict=True)]
                )
                total["n"] = m
                return total["c"].copy()

            res = sequential_test(counts_at, s.probs, n, alpha)
            hits += not res.passed
        assert res is not None
        shape = f"{s.probs.shape[0]} x {s.probs.shape[1]}"
        print(f"| {w.name} | {shape} | {df} | {n:,} | {res.floor_tv:.2e} | {hits}/{REPS} | "
              f"{rate / 1e6:.2f}M |")  # fmt: skip


def timed(label: str, pipe: Pipeline, **kw) -> None:
    t = time.process_time()
    df = check_pipeline(pipe, progress=False, **kw)
    bad = df[~df["lossless"]]
    where = (f"caught in {bad.iloc[0]['world']} after {int(bad.iloc[0]['n']):,} blocks"
             if len(bad) else f"not caught ({int(df['n'].sum()):,} blocks)")  # fmt: skip
    print(f"- `{label}`: {where}, {time.process_time() - t:.0f} CPU-s")


def main() -> None:
    print("# The statistical path, measured (issues #12, #36)\n")
    print(
        "Made by `python reports/lossless/power.py` (seed 0; CPU-seconds of this process). "
        "The sampler draws every block of generations from the empty prompt that starts at "
        "positions 0 to 8 + gamma + 1, and counts its gamma+1-token window per context "
        "(the token before the block, or the start). Power: 200 sequential tests per world "
        "of counts drawn with the reference sampler's context shares from the target law "
        "moved by TV 1e-3 in every context (mass moved from the heavier half of the cells "
        "to the rest), at the world's planned n and the per-look alpha of a six-world run "
        "(3.3e-8). The floor TV is the theoretical 99%-power TV in the least favourable "
        "direction; df (plan) counts every cell of every context (an upper bound).\n"
    )
    power_rows()
    print()
    print("Statistical-only run of a lossless verifier that draws its own uniforms "
          "(`my_verifier:verify_rng`: no exact check, every world on its full plan):")  # fmt: skip
    print()
    sys.path.insert(0, "examples/lossless")
    from specsim.lossless.user import verifier_pipeline

    t = time.process_time()
    df = check_pipeline(verifier_pipeline("my_verifier:verify_rng"), progress=False)
    print(f"{time.process_time() - t:.0f} CPU-s, {int(df['n'].sum()):,} blocks, verdicts: "
          f"{', '.join(df['status'])}")  # fmt: skip
    print()
    print("Mutants, statistical check only (full plan, stops at the first world and look that "
          "rejects):")  # fmt: skip
    print()
    for name in ("band-in-cell-1e-2", "band-3e-3-recovered-only", "reject-when-u-below-1e-3",
                 "flip-when-v-below-1e-3", "fixed-point-uniforms", "peeks-after-first-block",
                 "second-block-stale-ratio", "bonus-temperature-v4"):  # fmt: skip
        timed(name, by_name(name).pipeline, checks=("statistical",), stop_at_first_failure=True)
    print()
    print(f"False-alarm stress: correct pipelines, statistical checks only, 300,000 blocks a "
          f"world, seeds {FALSE_ALARM_SEEDS.start}-{FALSE_ALARM_SEEDS.stop - 1}:")  # fmt: skip
    print()
    total = fails = 0
    worst = 1.0
    t = time.process_time()
    for seed in FALSE_ALARM_SEEDS:
        for pipe in correct_pipelines():
            df = check_pipeline(pipe, seed=seed, samples=300_000, checks=("statistical",),
                                progress=False)  # fmt: skip
            total += len(df)
            fails += int((~df["lossless"]).sum())
            worst = min(worst, float(df["p_value"].min()))
    print(
        f"{len(correct_pipelines())} pipelines: {fails} false alarms in {total} sequential "
        f"tests, smallest p-value {worst:.2g} ({time.process_time() - t:.0f} CPU-s)"
    )


if __name__ == "__main__":
    main()
