"""Is a grid's offset set when its profile is measured, or while its runs go? (torch-free)

A grid's cells share one profile, measured in the first ~9 minutes, and one speed reference;
its runs go repeat-major (every cell once, then every cell again), so each repeat spans about
half of the hour. For each repeat this prints the mean and median of the cells' throughput
error (simulated over that repeat's real throughput, minus 1) and the runs' mean speed factor
(raw CPU over ref-clock seconds). An offset that the run-time conversion made would move with
the speed factor between the repeats; one that the profile made stays put.

    python studies/fidelity_grid_offset.py reports/fidelity [more report dirs]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

KEYS = ["drafter", "policy", "load"]


def offsets(report: Path) -> pd.DataFrame:
    """Per (closed or open loop, repeat): runs, mean / median throughput error, speed factor."""
    runs = pd.read_csv(report / "runs.csv")
    cells = pd.read_csv(report / "fidelity.csv")[[*KEYS, "sim_throughput_tok_s"]]
    m = runs.merge(cells, on=KEYS, validate="many_to_one")
    m["err"] = m["sim_throughput_tok_s"] / m["ref_throughput_tok_s"] - 1
    m["loop"] = m["load"].str.startswith("C=").map({True: "closed", False: "open"})
    g = m.groupby(["loop", "repeat"])
    out = pd.DataFrame(
        {
            "runs": g.size(),
            "mean err %": 100 * g["err"].mean(),
            "median err %": 100 * g["err"].median(),
            "speed factor": g["speed_factor"].mean(),
        }
    )
    return out.round(2).reset_index()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", type=Path, nargs="*", default=[Path("reports/fidelity")])
    for rep in ap.parse_args().reports:
        print(f"{rep}\n{offsets(rep).to_markdown(index=False)}\n")


if __name__ == "__main__":
    main()
