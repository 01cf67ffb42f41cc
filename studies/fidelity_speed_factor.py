"""Does a fidelity cell's error follow its run's speed factor? (torch-free, reads a report)

Each real run of ``specsim validate --clock ref`` reports its speed factor (raw CPU seconds over
ref-clock seconds: > 1, the core was slower than when the speed reference was taken). If the
reference's probe (a 4-token forward) stood for every forward shape, a run's ref-clock times
would not depend on it. This prints, per group of closed-loop runs, the correlation and the
slope of each run's mean-TPOT error (simulated over that run's real TPOT, minus 1) on its speed
factor: ``full`` (8-token blocks: the largest forwards) against the other policies, and one or
two requests against four or more.

    python studies/fidelity_speed_factor.py reports/fidelity reports/fidelity/pilots/pilot-v6
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd


def speed_factor_table(report: Path) -> pd.DataFrame:
    runs = pd.read_csv(report / "runs.csv")
    cells = pd.read_csv(report / "fidelity.csv")
    keys = ["drafter", "policy", "load"]
    m = runs.merge(cells[[*keys, "sim_tpot_ms_mean"]], on=keys)
    m = m[m["load"].str.startswith("C=")].copy()
    m["err"] = m["sim_tpot_ms_mean"] / m["ref_tpot_ms_mean"] - 1.0
    m["blocks"] = np.where(m["policy"] == "full", "full", "other policies")
    m["requests"] = np.where(m["load"].str[2:].astype(int) >= 4, "C >= 4", "C <= 2")
    rows = []
    for (blocks, reqs), g in m.groupby(["blocks", "requests"]):
        if len(g) < 4 or g["speed_factor"].std() == 0:
            continue
        rows.append(
            {
                "report": report.name,
                "runs of": f"{blocks}, {reqs}",
                "runs": len(g),
                "speed factor range": f"{g.speed_factor.min():.2f}-{g.speed_factor.max():.2f}",
                "corr": round(float(np.corrcoef(g.speed_factor, g.err)[0, 1]), 2),
                "slope": round(float(np.polyfit(g.speed_factor, g.err, 1)[0]), 3),
                "median err": f"{100 * g.err.median():+.1f}%",
            }
        )
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("reports", nargs="+", type=Path, help="fidelity report directories")
    args = ap.parse_args()
    table = pd.concat([speed_factor_table(r) for r in args.reports], ignore_index=True)
    print(table.to_string(index=False))


if __name__ == "__main__":
    main()
