"""How short could a fidelity grid be on this machine? The engine's own compute, read from a
finished grid (torch-free, seconds).

Issue 15 asks for the report's grid (6 policies x C = 1-16 x 2 drafters, open loop at 3 rates,
64 new tokens, ``--repeats``) in under 45 minutes. A real run's wall time is its engine's
compute plus what the ref clock spends re-timing its probes. The compute is in the report: each
step's duration in ``engine_steps.parquet`` is in reference seconds, and the run's speed factor
(``runs.csv``: raw CPU seconds over reference seconds) turns it back into this core's seconds.
What is left of the run's wall time is the probes' cost. The floor of a grid is then the
engine's compute for the runs it makes (no probes at all) plus its profiles (``phases_s`` in
``config.json``), itself engine runs and forwards that no grid can skip.

    python studies/fidelity_grid_floor.py reports/fidelity
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

KEYS = ["drafter", "policy", "load", "repeat"]


def run_compute(report: Path) -> pd.DataFrame:
    """Per real run: its wall seconds, its engine compute in this core's seconds, closed loop?"""
    runs = pd.read_csv(report / "runs.csv")
    steps = pd.read_parquet(report / "engine_steps.parquet", columns=[*KEYS, "duration_s"])
    ref = steps.groupby(KEYS)["duration_s"].sum().rename("ref_s").reset_index()
    df = runs.merge(ref, on=KEYS, how="left", validate="one_to_one")
    df["compute_s"] = df["ref_s"] * df["speed_factor"]
    df["closed"] = df["load"].str.startswith("C=")
    return df[[*KEYS, "closed", "run_wall_s", "compute_s"]]


def floor_table(report: Path) -> pd.DataFrame:
    """Seconds for the grid's runs at 1 and 2 repeats (open loop 1 or 2), with and without the
    probes' cost, plus the grid's measured profiles."""
    df = run_compute(report)
    cfg = json.loads((report / "config.json").read_text())
    phases = cfg.get("phases_s", {})
    prof = float(phases.get("traces and profiles", "nan"))  # nan: a grid from before v8
    per_rep = df.groupby(["closed", "repeat"])[["run_wall_s", "compute_s"]].sum()
    one = per_rep.groupby("closed").mean()  # one pass over the cells (mean of the repeats)
    rows = []
    for closed_rep, open_rep in ((1, 1), (2, 1), (2, 2)):
        wall = closed_rep * one.loc[True, "run_wall_s"] + open_rep * one.loc[False, "run_wall_s"]
        comp = closed_rep * one.loc[True, "compute_s"] + open_rep * one.loc[False, "compute_s"]
        rows.append(
            {
                "repeats closed / open": f"{closed_rep} / {open_rep}",
                "runs": int(
                    closed_rep * df[df.closed & (df.repeat == 0)].shape[0]
                    + open_rep * df[~df.closed & (df.repeat == 0)].shape[0]
                ),
                "engine compute s": round(comp),
                "run wall s (with probes)": round(wall),
                "profiles s": prof,
                "floor min (compute + profiles)": round((comp + prof) / 60, 1),
                "as run min (+ probes)": round((wall + prof) / 60, 1),
            }
        )
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", type=Path, nargs="?", default=Path("reports/fidelity"))
    a = ap.parse_args()
    df = run_compute(a.report)
    share = 1 - df["compute_s"].sum() / df["run_wall_s"].sum()
    print(
        f"{len(df)} runs: {df['run_wall_s'].sum():.0f} s wall, {df['compute_s'].sum():.0f} s "
        f"engine compute; the probes' share of the runs' wall time {100 * share:.1f}%"
    )
    print(floor_table(a.report).to_markdown(index=False))


if __name__ == "__main__":
    main()
