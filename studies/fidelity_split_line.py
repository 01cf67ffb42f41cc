"""Would a straight line through the per-request verify split fit the real runs better than its
per-R medians? Re-simulates every cell of a finished grid (torch-free, ~5 s).

The profile's loop overhead at R (``overhead_curve``) is the engine loop's own time plus the
"verify split": R requests' tokens in one forward against the same tokens as one request, the
median of 9 alternating pairs at each R. Those medians are differences of two ~100-ms forwards;
between v8's two profiles (same target, same points, one hour apart) they differ by 4.4 ms at
R = 2, while the slope of a line through them differs by 0.04 ms per request. This replays the
grid with the split taken from that line (each drafter's own slope, or the two pooled) and
with the two drafters' medians pooled, and scores each against the same real runs.

    python studies/fidelity_split_line.py reports/fidelity
    # an older grid: mkdir v7 && git archive 5934f5f reports/fidelity | tar -x -C v7, then
    # run this from inside v7 (its config.json names the traces relative to the checkout)
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from specsim.fidelity.ablation import score_variants
from specsim.sim.cost_profiles import read_profile_csv

SLOPE = "verify_split_ms_per_request"  # the profile's line through the split's medians


def split_variants(report: Path):  # type: ignore[no-untyped-def]
    """``(drafter, measured profile) -> {variant name: cost model}`` for
    :func:`~specsim.fidelity.ablation.score_variants`."""
    drafters = pd.read_csv(report / "fidelity.csv")["drafter"].unique()
    per = {str(d): pd.read_csv(report / f"profile-{d}-per-request.csv") for d in drafters}
    slopes = {
        str(d): float(read_profile_csv(report / f"profile-{d}.csv").meta[SLOPE]) for d in drafters
    }
    pooled_slope = float(np.mean(list(slopes.values())))
    pooled = pd.concat(per.values()).groupby("requests")["verify_extra_ms"].mean()

    def variants(d: str, cost):  # type: ignore[no-untyped-def]
        rr = per[d]["requests"].to_numpy()
        loop = per[d]["loop_ms"].clip(lower=0.0).to_numpy()

        def curve(extra):  # type: ignore[no-untyped-def]
            pts = zip(rr, extra, loop, strict=True)
            return tuple((int(r), float(max(e, 0.0) + lp)) for r, e, lp in pts)

        return {
            "profile as measured (the split's median at each R)": cost,
            "split as a line, the drafter's own slope": replace(
                cost, overhead_curve=curve(slopes[d] * (rr - 1))
            ),
            "split as a line, the drafters' slopes pooled": replace(
                cost, overhead_curve=curve(pooled_slope * (rr - 1))
            ),
            "split medians pooled over the drafters": replace(
                cost, overhead_curve=curve(pooled.loc[rr].to_numpy())
            ),
        }

    return variants


def score(report: Path) -> pd.DataFrame:
    """One row per variant: cells with throughput and mean TPOT both within 5%, medians."""
    df = score_variants(report, split_variants(report))
    out = []
    for name, g in df.groupby("variant", sort=False):
        t, p = g["err_throughput_tok_s"].abs(), g["err_tpot_ms_mean"].abs()
        out.append(
            {
                "overhead curve": name,
                "both within 5%": f"{int(((t <= 0.05) & (p <= 0.05)).sum())} of {len(g)}",
                "median |err| thr / TPOT": f"{100 * t.median():.1f}% / {100 * p.median():.1f}%",
                "worst": f"{100 * t.max():.1f}% / {100 * p.max():.1f}%",
            }
        )
    return pd.DataFrame(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", type=Path, nargs="?", default=Path("reports/fidelity"))
    print(score(ap.parse_args().report).to_markdown(index=False))


if __name__ == "__main__":
    main()
