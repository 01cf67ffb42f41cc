"""Add the ``passes`` column to a calibration step table measured before it existed.

``specsim validate --step-clock server`` now writes, for each server-clock step, the tokens of
each forward pass the server cut its decoders into (specsim/sim/ubatch.py); the folders measured
before (reports/llama-cpp-v4/tuning-3, held-out) kept every calibration step's slots in
``logs/steps/calibration-<setting>.parquet``. This puts each logged slot step into the
server-clock step whose [start, end) holds its start time, and cuts the step into passes. The
client clock's rows get "" (no slots). Usage: ``python scripts/add_passes.py FOLDER [--force]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from specsim.sim.ubatch import pass_text, ubatch_sizes

SPECS = {"none": "none", "ngram-3": "ngram:3", "ngram-7": "ngram:7", "dspark-7": "dspark:7",
         "dspark-7-0.3": "dspark:7:0.3"}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--force", action="store_true", help="replace an existing column")
    a = ap.parse_args()
    path = a.folder / "calibration_steps.parquet"
    steps = pd.read_parquet(path)
    if "passes" in steps and not a.force:
        print(f"{path} already has 'passes'; pass --force to recount", file=sys.stderr)
        return 2
    steps = steps.drop(columns=["ubatches"], errors="ignore")
    out = [""] * len(steps)
    server = (steps["clock"] == "server").to_numpy()
    for f in sorted((a.folder / "logs" / "steps").glob("calibration-*.parquet")):
        spec = SPECS[f.stem.removeprefix("calibration-")]
        mine = np.flatnonzero(server & (steps["spec"] == spec).to_numpy())
        rows = steps.iloc[mine].sort_values("start_s")
        start, end = rows["start_s"].to_numpy(), rows["end_s"].to_numpy()
        log = pd.read_parquet(f)
        at = np.searchsorted(start, log["t_s"].to_numpy(), side="right") - 1
        inside = (at >= 0) & (log["t_s"].to_numpy() < end[np.maximum(at, 0)])
        log = log[inside].assign(step=at[inside])
        cut = {
            k: pass_text(ubatch_sizes(g["slot"].tolist(), (1 + g["drafted"]).tolist()))
            for k, g in log.groupby("step")
        }
        idx = rows.index.to_numpy()
        dec = rows["decoding"].to_numpy()
        for i in range(len(rows)):
            out[idx[i]] = cut.get(i, "") if dec[i] > 0 else ""
    steps = steps.assign(passes=out)
    tmp = path.with_suffix(".tmp")
    steps.to_parquet(tmp)
    tmp.replace(path)
    got = steps[server & (steps["decoding"] > 0).to_numpy()]
    n = got["passes"].str.split().str.len()
    print(
        f"{path}: {len(got)} server-clock decode steps, passes per step "
        f"{n[n > 0].mean():.2f} mean, {int((n == 0).sum())} unmatched"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
