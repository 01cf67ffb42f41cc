"""What the engine loop costs per step, against what the profile charged (torch-free, reads a
report).

The loop is a step's time outside the drafting, the policy and the target forward (the engine's
own timers: building the batch, accepting, committing, streaming). For every decode-only step
of a ``specsim validate`` report (``engine_steps.parquet``) this fits that time on ``1, R, B``
(R decoding requests, B verified tokens) and prints, per drafter, policy and concurrency, the
loop's median against what the report's profile charged for it: the loop part of the overhead
curve at R (``loop_ms`` in ``profile-<drafter>-per-request.csv``) plus ``accept_per_token_ms``
x B where the profile has that term (v6 on).

    python studies/fidelity_loop_terms.py reports/fidelity
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from specsim.sim.cost import curve_at
from specsim.sim.cost_profiles import read_profile_csv


def loop_table(report: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-cell medians real against charged, per-drafter least-squares fit)."""
    s = pd.read_parquet(report / "engine_steps.parquet")
    s = s[(s["prefilling"] == 0) & (s["decoding"] > 0)].copy()
    s["real_loop_ms"] = 1e3 * (s["duration_s"] - s["draft_s"] - s["sched_s"] - s["verify_s"])
    cells, fits = [], []
    for drafter, g in s.groupby("drafter"):
        cost = read_profile_csv(report / f"profile-{drafter}.csv")
        per = pd.read_csv(report / f"profile-{drafter}-per-request.csv")
        loop = tuple(zip(per["requests"].astype(int), per["loop_ms"].clip(lower=0), strict=True))
        r = g["decoding"].to_numpy(np.float64)
        b = g["batch_tokens"].to_numpy(np.float64)
        g = g.assign(model_loop_ms=curve_at(loop, r) + cost.accept_per_token_ms * b)
        cells.append(g)
        x = np.column_stack([np.ones_like(r), r, b])
        coef, *_ = np.linalg.lstsq(x, g["real_loop_ms"].to_numpy(), rcond=None)
        fits.append(
            {
                "drafter": drafter,
                "steps": len(g),
                "fit_ms": float(coef[0]),
                "fit_ms_per_request": float(coef[1]),
                "fit_ms_per_token": float(coef[2]),
                "fit_resid_sd_ms": float(np.std(g["real_loop_ms"] - x @ coef)),
                "profile_ms_per_token": cost.accept_per_token_ms,
                "profile_resid_sd_ms": float(np.std(g["real_loop_ms"] - g["model_loop_ms"])),
            }
        )
    steps = pd.concat(cells)
    steps["tokens_per_request"] = steps["batch_tokens"] / steps["decoding"]
    table = (
        steps.groupby(["drafter", "policy", "concurrency"])
        .agg(
            steps=("real_loop_ms", "size"),
            requests=("decoding", "mean"),
            tokens_per_request=("tokens_per_request", "mean"),
            real_loop_ms=("real_loop_ms", "median"),
            model_loop_ms=("model_loop_ms", "median"),
        )
        .reset_index()
    )
    return table, pd.DataFrame(fits)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reports", nargs="+", type=Path)
    args = ap.parse_args()
    pd.set_option("display.width", 200)
    for report in args.reports:
        table, fits = loop_table(report)
        print(f"# {report}")
        print(fits.round(4).to_string(index=False))
        print(table.round(2).to_string(index=False))


if __name__ == "__main__":
    main()
