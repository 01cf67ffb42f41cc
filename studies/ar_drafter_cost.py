"""What `ar` pays for a drafter it never uses, and what that does to `auto`'s comparison
(torch-free; replays, no timing).

The simulator and the real engine run the drafter on every decode step and then ask the
policy for lengths; `ar` (`static:0`) answers 0 for every request, so its steps pay the
drafting and the scheduler for nothing. A server running without speculation skips both
(vLLM drops the drafter for a batch once speculation is off). This replays `ar` at every
point of reports/schedulers-under-load's "Is `auto` ever the wrong choice?" section (its
committed ``auto-<profile>.parquet`` sweeps: 7 traces x 4 profiles x 5 loads, 200 requests,
each point's own seed) twice: with the profile as it is, which must give the committed `ar`
throughput back, and with drafting and scheduling free, i.e. what `ar` would cost on a server
without speculation. Then it scores the committed `auto` against the best built-in again,
with that `ar` among them.

    python studies/ar_drafter_cost.py
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from specsim.sim.cost_profiles import get_profile
from specsim.sim.simulate import replay
from specsim.trace.io import read_trace

REPORT = Path("reports/schedulers-under-load")
FREE = {
    "draft_base_ms": 0.0,
    "draft_per_request_ms": 0.0,
    "draft_per_token_ms": 0.0,
    "draft_per_context_us": 0.0,
    "draft_curve": (),
    "sched_base_us": 0.0,
    "sched_us_per_request": 0.0,
}


def ar_points(report: Path) -> pd.DataFrame:
    """Every point of the auto sweeps: committed throughputs, and `ar` replayed both ways."""
    rows, traces = [], {}
    for path in sorted(report.glob("auto-*.parquet")):
        t = pd.read_parquet(path)
        prof = str(t["profile"].iloc[0])
        cost = get_profile(prof)
        free = replace(cost, **FREE)
        refs = t.groupby(["trace", "concurrency", "policy"])["throughput_tok_s"].mean().unstack()
        for row in t[t["policy"] == "ar"].itertuples():
            if row.trace_path not in traces:
                traces[row.trace_path] = read_trace(row.trace_path)
            trace = traces[row.trace_path]
            kw = {"concurrency": int(row.concurrency), "requests": int(row.requests)}
            kw |= {"seed": int(row.seed), "record_tokens": False, "record_steps": False}
            again = replay(trace, "ar", profile=cost, **kw).summary["throughput_tok_s"]
            bare = replay(trace, "ar", profile=free, **kw).summary["throughput_tok_s"]
            ref = refs.loc[(row.trace, row.concurrency)]
            others = ref.drop(labels=["auto", "oracle", "ar"], errors="ignore")
            rows.append(
                {
                    "profile": prof,
                    "trace": row.trace,
                    "load": row.concurrency,
                    "ar committed": row.throughput_tok_s,
                    "ar replayed": again,
                    "ar without drafter": bare,
                    "best other built-in": others.max(),
                    "auto": ref["auto"],
                }
            )
    return pd.DataFrame(rows)


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per profile: what the drafter costs `ar`, and `auto` against the best built-in with
    the committed `ar` and with `ar` without the drafter."""
    df = df.assign(
        gain=df["ar without drafter"] / df["ar committed"] - 1,
        best_then=np.maximum(df["best other built-in"], df["ar committed"]),
        best_now=np.maximum(df["best other built-in"], df["ar without drafter"]),
    )
    out = []
    for prof, g in df.groupby("profile", sort=False):
        then, now = g["auto"] / g["best_then"], g["auto"] / g["best_now"]
        out.append(
            {
                "profile": prof,
                "points": len(g),
                "ar without drafter, throughput gain": (
                    f"+{100 * g['gain'].min():.1f}% to +{100 * g['gain'].max():.1f}%"
                ),
                "auto within 2% of best (committed ar)": int((then >= 0.98).sum()),
                "auto within 2% of best (ar without drafter)": int((now >= 0.98).sum()),
                "lowest auto / best (ar without drafter)": round(float(now.min()), 3),
                "ar the best (without drafter)": int(
                    (g["ar without drafter"] >= g["best other built-in"]).sum()
                ),
            }
        )
    return pd.DataFrame(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("report", type=Path, nargs="?", default=REPORT)
    df = ar_points(ap.parse_args().report)
    off = (df["ar replayed"] / df["ar committed"] - 1).abs().max()
    print(f"{len(df)} points; ar replayed against committed: max |diff| {off:.2e}")
    print(summary(df).to_markdown(index=False))


if __name__ == "__main__":
    main()
