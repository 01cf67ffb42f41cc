"""Would a steadier step table have helped? Replays a finished grid with other tables (torch-free).

The engine profile's large table points move 5-13% from one profile to the next at the grid's
3 passes (benchmarks/README.md, "Large points"), and a grid measures one table per drafter for
the same target forward. This replays every cell of a committed report (its own real runs,
traces and profiles) with each drafter's step table replaced by:

- ``pooled tables``: the geometric mean of the drafters' tables, point by point (what
  ``validate --shared-table`` measures directly: one table with both profiles' passes);
- ``smoothed B>=24``: each context row's points from B = 24 up replaced by a quadratic
  least-squares fit in B (the small-B points stay jagged: kernel shapes, docs/fidelity.md);
- both.

In-sample (the same real runs the tables are scored on), so a screen for the next grid, not a
result. Prints cells with throughput and mean TPOT both within 5%, median and worst |error|,
and the ``full`` cells' median throughput error.

    python studies/fidelity_table_variants.py reports/fidelity
"""

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from specsim.fidelity.ablation import replay_cell
from specsim.sim.cost_profiles import read_profile_csv
from specsim.trace.io import read_trace

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("report", type=Path, help="a fidelity report directory (two drafters)")
out = ap.parse_args().report
table = pd.read_csv(out / "fidelity.csv")
cfg = json.loads((out / "config.json").read_text())
costs = {
    d: read_profile_csv(out / f"profile-{d.replace(':', '')}.csv") for d in table.drafter.unique()
}


def smooth(ms, b, lo=24):
    ms = ms.copy()
    for i in range(ms.shape[0]):
        sel = b >= lo
        coef = np.polyfit(b[sel], ms[i, sel], 2)
        ms[i, sel] = np.polyval(coef, b[sel])
    return ms


pooled = np.exp(np.mean([np.log(c.step_ms) for c in costs.values()], axis=0))
variants = {}
for d, c in costs.items():
    b = c.batch_tokens.astype(float)
    variants[d] = {
        "as measured": c,
        "pooled tables": replace(c, step_ms=pooled),
        "smoothed B>=24": replace(c, step_ms=smooth(c.step_ms, b)),
        "pooled + smoothed": replace(c, step_ms=smooth(pooled, b)),
    }
rows = []
for d, grp in table.groupby("drafter", sort=False):
    trace = read_trace(cfg["traces"][d])
    for name, v in variants[d].items():
        for r in grp.itertuples():
            m = replay_cell(trace, r, cfg, v)
            thr = m["throughput_tok_s"] / r.real_throughput_tok_s - 1
            tpot = m["tpot_ms_mean"] / r.real_tpot_ms_mean - 1
            rows.append({"variant": name, "policy": r.policy, "thr": thr, "tpot": tpot})
df = pd.DataFrame(rows)
for name, g in df.groupby("variant", sort=False):
    both = ((g.thr.abs() < 0.05) & (g.tpot.abs() < 0.05)).sum()
    full = g[g.policy == "full"]
    med = f"{100 * g.thr.abs().median():.1f}% / {100 * g.tpot.abs().median():.1f}%"
    worst = f"{100 * g.thr.abs().max():.1f}% / {100 * g.tpot.abs().max():.1f}%"
    print(
        f"{name:20s} cells {len(g)}, both within 5%: {both}; median |err| {med}; worst "
        f"{worst}; full cells' median throughput err {100 * full.thr.median():+.1f}%"
    )
