"""Does a forward's gap to the model depend on its size and on the run's speed? (torch-free)

``--clock ref`` divides each target forward's CPU time by the current speed of a probe. If a
4-token probe stood for every forward, a decode step's verification (real, on the ref clock)
over what the profile charges for it (its step-table point at the step's tokens and context,
plus the per-request split at its requests) would not depend on the forward's size, nor on
the run's speed factor (raw CPU over ref-clock seconds: < 1, the core was faster than at the
reference). Per forward size (verified tokens of the step) this prints the steps' median
ratio, and the slope of each run's median ratio on its speed factor: across all runs, and
within a cell (one repeat against the other: the cell's policy, load and requests cancel).
A slope below 0 means large forwards speed up less than the probe: dividing them by the
probe's factor over-corrects them on a fast core. Then the same ratio for prefill-only steps
(the largest forwards), by prompt size.

    python studies/fidelity_forward_gap.py reports/fidelity
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from specsim.sim.cost import curve_at
from specsim.sim.cost_profiles import read_profile_csv

BINS = [0, 8, 32, 64, 4096]  # verified tokens of a step


def step_ratios(report: Path) -> pd.DataFrame:
    """Every decode-only step with its forward real / modelled ratio."""
    s = pd.read_parquet(report / "engine_steps.parquet")
    s = s[(s.prefilling == 0) & (s.decoding > 0)]
    out = []
    for d, g in s.groupby("drafter"):
        cost = read_profile_csv(report / f"profile-{d}.csv")
        pr = pd.read_csv(report / f"profile-{d}-per-request.csv")
        split = tuple(zip(pr.requests.astype(int), pr.verify_extra_ms, strict=True))
        bc = zip(g.batch_tokens, g.ctx_mean, strict=True)
        tab = [cost.step_time(int(b), float(c)) for b, c in bc]
        model = np.array(tab) * 1e3 + curve_at(split, g.decoding.to_numpy(float))
        out.append(g.assign(ratio=g.verify_s * 1e3 / model))
    steps = pd.concat(out, ignore_index=True)
    steps["tokens"] = pd.cut(steps.batch_tokens, BINS)
    return steps


def gap_table(report: Path) -> pd.DataFrame:
    steps = step_ratios(report)
    runs = pd.read_csv(report / "runs.csv")
    keys = ["drafter", "policy", "load", "repeat"]
    per = steps.groupby([*keys, "tokens"], observed=True).ratio.median().rename("ratio")
    per = per.reset_index().merge(runs[[*keys, "speed_factor"]], on=keys)
    rows = []
    for b, h in per.groupby("tokens", observed=True):
        n_steps = int((steps.tokens == b).sum())
        p = h.pivot_table(index=keys[:3], columns="repeat", values=["ratio", "speed_factor"])
        p = p.dropna()
        pair = float("nan")
        if len(p) >= 3 and p["speed_factor"].shape[1] >= 2:
            ds = p["speed_factor"].iloc[:, 1] - p["speed_factor"].iloc[:, 0]
            dr = p["ratio"].iloc[:, 1] - p["ratio"].iloc[:, 0]
            pair = float(np.polyfit(ds, dr, 1)[0])
        rows.append(
            {
                "report": str(report),
                "verified tokens": f"{b.left + 1}-{b.right}",
                "steps": n_steps,
                "runs": len(h),
                "median real / model": round(float(steps.ratio[steps.tokens == b].median()), 3),
                "slope on speed factor": round(float(np.polyfit(h.speed_factor, h.ratio, 1)[0]), 3),
                "corr": round(float(np.corrcoef(h.speed_factor, h.ratio)[0, 1]), 2),
                "within-cell pairs": len(p),
                "pair slope": round(pair, 3),
            }
        )
    return pd.DataFrame(rows)


def prefill_table(report: Path) -> pd.DataFrame:
    """Prefill-only steps (no request decoding): real over modelled (the step less drafting
    and policy against the cost model's verification of those prompt tokens), by prompt size."""
    s = pd.read_parquet(report / "engine_steps.parquet")
    s = s[(s.prefilling > 0) & (s.decoding == 0)]
    rows = []
    for d, g in s.groupby("drafter"):
        cost = read_profile_csv(report / f"profile-{d}.csv")
        model = [
            cost.verify_s(0, int(r.prefill_tokens), int(r.running), cost.step_time_fn(r.ctx_mean))
            for r in g.itertuples()
        ]
        real = g.duration_s - g.draft_s - g.sched_s
        g = g.assign(ratio=real.to_numpy() / np.array(model))
        for b, h in g.groupby(pd.cut(g.prefill_tokens, [0, 64, 128, 256, 4096]), observed=True):
            rows.append(
                {
                    "report": str(report),
                    "drafter": d,
                    "prompt tokens": f"{b.left + 1}-{b.right}",
                    "steps": len(h),
                    "mean prompt tokens": round(float(h.prefill_tokens.mean()), 1),
                    "median real / model": round(float(h.ratio.median()), 3),
                }
            )
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("reports", nargs="+", type=Path, help="fidelity report directories")
    args = ap.parse_args()
    pd.set_option("display.width", 200)
    table = pd.concat([gap_table(r) for r in args.reports], ignore_index=True)
    print(table.to_string(index=False))
    print("\nprefill-only steps")
    pre = pd.concat([prefill_table(r) for r in args.reports], ignore_index=True)
    print(pre.to_string(index=False))


if __name__ == "__main__":
    main()
