"""Held-out-11's comparison fixed before it ran (PLAN.md step 23): the same runs scored on
five recorded draws of every trace (the grid's own ``fidelity.csv``) and on draw 0 alone (a
copy of the folder rescored with ``--trace-draws 1``: ``one-draw/fidelity.csv``), side by side.

    python reports/llama-cpp-v4/held-out-11/draws_compare.py

Writes ``draws-acceptance.csv`` (pooled accepted per drafted token, by setting and by setting
and temperature, measured and simulated on five draws and on one) and ``draws-scores.csv``
(the medians and the gains under each) beside this script, and prints both.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent


def pooled(table: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Accepted per drafted token over every cell of each group, measured and simulated."""
    spec = table[table["spec"] != "none"]
    g = spec.groupby(by)[["real_drafted", "real_accepted", "sim_drafted", "sim_accepted"]].sum()
    out = pd.DataFrame({"real": g["real_accepted"] / g["real_drafted"],
                        "sim": g["sim_accepted"] / g["sim_drafted"]})  # fmt: skip
    out["error"] = out["sim"] / out["real"] - 1.0
    return out


def main() -> int:
    five = pd.read_csv(HERE / "fidelity.csv")
    one_path = HERE / "one-draw" / "fidelity.csv"
    if not one_path.is_file():
        print(f"no {one_path}: rescore a copy with --trace-draws 1 first", file=sys.stderr)
        return 2
    one = pd.read_csv(one_path)
    rows = []
    for by in (["spec"], ["spec", "temperature"]):
        a, b = pooled(five, by), pooled(one, by)
        both = a.join(b[["sim", "error"]].add_suffix("_one_draw")).reset_index()
        both["by"] = "+".join(by)
        rows.append(both)
    acc = pd.concat(rows, ignore_index=True)
    cols = ["by", "spec", "temperature", "real", "sim", "error", "sim_one_draw", "error_one_draw"]
    acc = acc[cols]
    acc.to_csv(HERE / "draws-acceptance.csv", index=False)
    scores = []
    for name, t in (("five draws", five), ("draw 0 alone", one)):
        scores.append({
            "traces": name,
            "throughput_median_abs_error": t["err_throughput_wall"].abs().median(),
            "tpot_mean_median_abs_error": t["err_tpot_mean_wall"].abs().median(),
            "throughput_worst_abs_error": t["err_throughput_wall"].abs().max(),
            "tpot_mean_worst_abs_error": t["err_tpot_mean_wall"].abs().max(),
        })  # fmt: skip
    sc = pd.DataFrame(scores)
    sc.to_csv(HERE / "draws-scores.csv", index=False)
    pd.set_option("display.width", 160)
    print(acc.round(4).to_string(index=False))
    print()
    print(sc.round(4).to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
