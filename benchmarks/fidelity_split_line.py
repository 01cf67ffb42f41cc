"""Would a straight line through the per-request verify split fit the real runs better than its
per-R medians? Re-simulates every cell of a finished grid (torch-free, about a minute).

The profile's loop overhead at R (``overhead_curve``) is the engine loop's own time plus the
"verify split": R requests' tokens in one forward against the same tokens as one request, the
median of 9 alternating pairs at each R. Those medians are differences of two ~100-ms forwards;
between v8's two profiles (same target, same points, one hour apart) they differ by 4.4 ms at
R = 2, while the slope of a line through them differs by 0.04 ms per request. This replays the
grid with the split taken from that line (each drafter's own slope, or the two pooled) and
with the two drafters' medians pooled, and scores each against the same real runs.

    python benchmarks/fidelity_split_line.py reports/fidelity
    # an older grid: mkdir v7 && git archive 5934f5f reports/fidelity | tar -x -C v7, then
    # run this from inside v7 (its config.json names the traces relative to the checkout)
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from specsim.analysis.fidelity_report import replay_cell
from specsim.sim.profiles import read_profile_csv
from specsim.trace.io import read_trace


def variants(report: Path) -> dict[str, dict[str, object]]:
    """{drafter: {variant name: cost model}} for the grid's profiles."""
    per = {d: pd.read_csv(p) for d, p in _profiles(report, "-per-request.csv").items()}
    costs = {d: read_profile_csv(p) for d, p in _profiles(report, ".csv").items()}
    slopes = {d: float(c.meta["verify_split_ms_per_request"]) for d, c in costs.items()}
    pooled_slope = float(np.mean(list(slopes.values())))
    pooled = pd.concat(per.values()).groupby("requests")["verify_extra_ms"].mean()
    out = {}
    for d, cost in costs.items():
        rr = per[d]["requests"].to_numpy()
        loop = per[d]["loop_ms"].clip(lower=0.0).to_numpy()

        def curve(extra, rr=rr, loop=loop):  # type: ignore[no-untyped-def]
            pts = zip(rr, extra, loop, strict=True)
            return tuple((int(r), float(max(e, 0.0) + lp)) for r, e, lp in pts)

        out[d] = {
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
    return out


def _profiles(report: Path, suffix: str) -> dict[str, Path]:
    table = pd.read_csv(report / "fidelity.csv")
    return {str(d): report / f"profile-{d}{suffix}" for d in table["drafter"].unique()}


def score(report: Path) -> pd.DataFrame:
    """One row per variant: cells with throughput and mean TPOT both within 5%, medians."""
    table = pd.read_csv(report / "fidelity.csv")
    cfg = json.loads((report / "config.json").read_text())
    rows = []
    for d, models in variants(report).items():
        trace = read_trace(cfg["traces"][d])
        for name, cost in models.items():
            for r in table[table["drafter"] == d].itertuples():
                m = replay_cell(trace, r, cfg, cost)
                rows.append(
                    {
                        "variant": name,
                        "t": m["throughput_tok_s"] / r.real_throughput_tok_s - 1,
                        "p": m["tpot_ms_mean"] / r.real_tpot_ms_mean - 1,
                    }
                )
    df = pd.DataFrame(rows)
    out = []
    for name, g in df.groupby("variant", sort=False):
        t, p = g["t"].abs(), g["p"].abs()
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
