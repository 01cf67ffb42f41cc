"""From check rows to one verdict per world and one line per run, each saying what it rests on.

A world is "proven (exact)" only for the law its exact check proved, and the verdict carries
that law (``covers``: which tokens, after which prefixes, for which policy); "consistent
(statistical, floor TV X)" states the floor for the blocks the sampler drew; "LOSSY (check)"
comes with the counterexample.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

VERDICT_COLUMNS = ["world", "verdict", "floor_tv", "covers", "detail"]


def world_verdicts(df: pd.DataFrame) -> pd.DataFrame:
    """One verdict per world: "LOSSY (check)", "proven (exact)", "consistent (statistical,
    floor TV X)" or "not checked", with what it covers and the detail that supports it."""
    out = []
    for world, part in df.groupby("world", sort=False):
        lossy = part[~part["lossless"]]
        exact = part[(part["check"] == "exact") & (part["status"] == "proven")]
        stat = part[(part["check"] == "statistical") & (part["status"] == "consistent")]
        law = part["law"] if "law" in part else pd.Series([""] * len(part), index=part.index)
        if len(lossy):
            r = lossy.iloc[0]
            verdict, detail, covers = f"LOSSY ({r['check']})", r["detail"], law[r.name]
        elif len(exact):
            r = exact.iloc[0]
            verdict, detail, covers = "proven (exact)", f"TV {r['tv']:.1e}", law[r.name]
        elif len(stat):
            floor = stat["detectable_tv"].max()
            verdict = f"consistent (statistical, floor TV {floor:.1e})"
            unproven = part[part["status"] == "unproven"]
            detail = unproven.iloc[0]["detail"] if len(unproven) else "no exact check ran"
            covers = law[stat.index[0]]
        else:
            verdict, detail, covers = "not checked", "", ""
        floor = stat["detectable_tv"].max() if len(stat) else np.nan
        out.append({"world": world, "verdict": verdict, "floor_tv": floor, "covers": covers,
                    "detail": detail})  # fmt: skip
    return pd.DataFrame(out, columns=VERDICT_COLUMNS)


def summary(df: pd.DataFrame) -> tuple[str, bool]:
    """The run's one-line verdict and whether it found evidence of loss."""
    v = world_verdicts(df)
    lossy = v["verdict"].str.startswith("LOSSY")
    proven = int((v["verdict"] == "proven (exact)").sum())
    tested = int(v["verdict"].str.startswith("consistent").sum())
    unchecked = int((v["verdict"] == "not checked").sum())
    if lossy.any():
        ran = int((df["status"] != "skipped").sum())
        return (f"LOSSY in {int(lossy.sum())} of {len(v)} worlds ({ran} checks, family-wise "
                "false-alarm rate <= 1e-6; checks after the first LOSSY one skipped)",
                True)  # fmt: skip
    floors = v.loc[v["verdict"].str.startswith("consistent"), "floor_tv"]
    text = f"no evidence of loss: {proven} of {len(v)} worlds proven exactly, {tested} only tested"
    if tested:
        text += f" statistically (floor TV {floors.max():.1e} at 99% power)"
    if unchecked:
        text += f", {unchecked} not checked"
    return text + "; exit 0 means no evidence of loss, a proof only for the proven worlds", False
