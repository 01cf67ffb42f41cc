"""The teeth table: every mutant caught, every correct implementation passing.

``mutant_table`` is what docs/losslessness.md shows and what the tests assert on: per mutant, the
largest exact TV over the worlds, whether the edge check caught it, the smallest G-test p-value,
and whether every method it is expected to be caught by did catch it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from specsim.lossless.check import DEFAULT_SAMPLES, check_pipeline
from specsim.lossless.mutants import Mutant, catalogue, correct_pipelines


def _summary(df: pd.DataFrame, check: str) -> tuple[bool, float, float]:
    """(caught, max TV, min p-value) of one kind of check."""
    part = df[df["check"] == check]
    if part.empty:
        return False, np.nan, np.nan
    return bool((~part["lossless"]).any()), part["tv"].max(), part["p_value"].min()


def mutant_row(
    m: Mutant,
    seed: int,
    samples: int,
    stop_early: bool = False,
    checks: tuple[str, ...] = ("exact", "edge", "statistical"),
) -> dict:
    """Run ``checks`` on a mutant (only those it is expected to fail, if ``stop_early``).

    ``caught``: every expected check that ran caught it (and at least one ran).
    """
    row: dict = {"mutant": m.name, "source": m.source, "expected": "+".join(m.caught_by)}
    verdicts = []
    for check in ("exact", "edge", "statistical"):
        if check not in checks or (stop_early and check not in m.caught_by):
            continue
        if check == "edge" and m.pipeline.multi is not None:
            continue
        df = check_pipeline(
            m.pipeline, seed=seed, samples=samples, checks=(check,),
            stop_at_first_failure=stop_early, progress=False,
        )  # fmt: skip
        caught, tv, p = _summary(df, check)
        row[f"{check}_caught"] = caught
        if check == "exact":
            row["exact_tv"] = tv
            failing = df[~df["lossless"]]
            row["counterexample"] = (
                f"{failing.iloc[0]['world']}: {failing.iloc[0]['detail']}" if caught else ""
            )
        if check == "statistical":
            row["stat_p_value"] = p
            row["stat_detectable_tv"] = df["detectable_tv"].max()
        if check in m.caught_by:
            verdicts.append(caught)
    row["caught"] = bool(verdicts) and all(verdicts)
    return row


def mutant_table(
    seed: int = 0,
    samples: int = DEFAULT_SAMPLES,
    stop_early: bool = False,
    checks: tuple[str, ...] = ("exact", "edge", "statistical"),
) -> pd.DataFrame:
    return pd.DataFrame([mutant_row(m, seed, samples, stop_early, checks) for m in catalogue()])


def stress(seeds=range(20), samples: int = DEFAULT_SAMPLES) -> pd.DataFrame:
    """The statistical checks under many seeds (run once while developing, not in CI): how many
    correct pipelines pass and how many statistically-caught mutants are caught, per seed."""
    rows = []
    stat_mutants = [m for m in catalogue() if "statistical" in m.caught_by]
    for seed in seeds:
        ok = 0
        for pipe in correct_pipelines():
            df = check_pipeline(pipe, seed=seed, samples=samples, checks=("statistical",),
                                progress=False)  # fmt: skip
            ok += bool(df["lossless"].all())
        caught = 0
        for m in stat_mutants:
            df = check_pipeline(m.pipeline, seed=seed, samples=samples, checks=("statistical",),
                                stop_at_first_failure=True, progress=False)  # fmt: skip
            caught += bool((~df["lossless"]).any())
        rows.append({"seed": seed, "correct_passed": ok, "correct_total": len(correct_pipelines()),
                     "mutants_caught": caught, "mutants_total": len(stat_mutants)})  # fmt: skip
    return pd.DataFrame(rows)
