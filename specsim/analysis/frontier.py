"""From a sweep table to the numbers a capacity plan needs: Pareto curves and SLA throughput.

A sweep gives, per policy and load, the throughput of one GPU (tok/s) and the mean decode speed
each user sees (tok/s/user). Raising the load trades the second for the first. "Throughput at an
SLA of X tok/s/user" is the most throughput a policy delivers while every-user speed stays at or
above X: read off the policy's Pareto frontier, interpolating linearly between the two swept
loads that bracket X. It is NaN when no swept load is fast enough (the SLA is out of reach), and
a frontier point is only interpolated between measured points, never extrapolated.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from specsim.errors import SpecsimError

X = "per_user_tps_mean"
Y = "throughput_per_gpu_tok_s"


def with_per_gpu(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with a throughput-per-GPU column (tables from before profiles declared their
    GPU count, or made by hand, get throughput_tok_s / gpus, gpus 1 when absent)."""
    if Y in table.columns or "throughput_tok_s" not in table.columns:
        return table
    gpus = table["gpus"] if "gpus" in table.columns else 1
    return table.assign(**{Y: table["throughput_tok_s"] / gpus})


def _need(table: pd.DataFrame, cols: list[str]) -> None:
    missing = [c for c in cols if c not in table.columns]
    if missing:
        raise SpecsimError(
            f"the results table has no column {missing[0]!r}; give a table made by specsim sweep"
        )


def curves(table: pd.DataFrame, by: tuple[str, ...] = ("trace", "policy")) -> pd.DataFrame:
    """Mean over seed replicates, one row per (by..., load), sorted by load."""
    table = with_per_gpu(table)
    _need(table, [*by, "load", X, Y])
    keys = [*by, "load"]
    num = table.select_dtypes("number").columns.difference(keys + ["replicate", "seed"])
    out = table.groupby(keys, sort=True, observed=True)[list(num)].mean().reset_index()
    n = table.groupby(keys, sort=True, observed=True).size().reset_index(name="n_seeds")
    return out.merge(n, on=keys)


def pareto_front(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats on both x and y, sorted by x ascending."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    order = np.lexsort((-y, -x))  # x descending, then y descending
    keep, best_y = [], -np.inf
    for i in order:
        if np.isfinite(x[i]) and np.isfinite(y[i]) and y[i] > best_y:
            keep.append(i)
            best_y = y[i]
    return np.array(keep[::-1], dtype=np.int64)


def throughput_at(x: np.ndarray, y: np.ndarray, target: float) -> float:
    """Highest throughput y on the frontier of (x, y) at per-user speed >= ``target``."""
    idx = pareto_front(x, y)
    if idx.size == 0:
        return float("nan")
    fx, fy = np.asarray(x, float)[idx], np.asarray(y, float)[idx]  # x ascending, y descending
    if target > fx[-1]:
        return float("nan")  # no swept load is that fast
    if target <= fx[0]:
        return float(fy[0])  # slower than every point: the best throughput swept
    j = int(np.searchsorted(fx, target))  # fx[j-1] < target <= fx[j]
    w = (target - fx[j - 1]) / (fx[j] - fx[j - 1])
    return float(fy[j - 1] + w * (fy[j] - fy[j - 1]))


def throughput_at_sla(
    table: pd.DataFrame,
    targets: list[float],
    baseline: str | None = "mtp1",
    by: tuple[str, ...] = ("trace",),
) -> pd.DataFrame:
    """Throughput per GPU (tok/s) at each SLA target (tok/s/user) per policy, and % gain over
    ``baseline`` (NaN where either is out of reach). One row per (by..., policy, sla_tps)."""
    if not targets:
        raise SpecsimError("give at least one SLA target in tok/s/user")
    cur = curves(table, by=(*by, "policy"))
    rows = []
    for key, grp in cur.groupby([*by, "policy"], sort=False, observed=True):
        key = key if isinstance(key, tuple) else (key,)
        for t in targets:
            row = dict(zip([*by, "policy"], key, strict=True))
            row["sla_tps"] = float(t)
            row[Y] = throughput_at(grp[X].to_numpy(), grp[Y].to_numpy(), t)
            rows.append(row)
    out = pd.DataFrame(rows)
    if baseline is not None:
        if baseline not in set(out["policy"]):
            raise SpecsimError(
                f"baseline policy {baseline!r} is not in the results; sweep it too or pick one "
                f"of {', '.join(sorted(set(out['policy'])))}"
            )
        base = out[out["policy"] == baseline][[*by, "sla_tps", Y]]
        base = base.rename(columns={Y: "baseline_tok_s"})
        out = out.merge(base, on=[*by, "sla_tps"], how="left")
        out["gain_pct"] = 100.0 * (out[Y] / out["baseline_tok_s"] - 1.0)
    return out


def speed_at_throughput(x: np.ndarray, y: np.ndarray, target: float) -> float:
    """Highest per-user speed on the frontier at throughput >= ``target`` tok/s."""
    idx = pareto_front(x, y)
    if idx.size == 0 or not np.isfinite(target):
        return float("nan")  # no frontier, or no throughput to match (a NaN baseline point)
    fx, fy = np.asarray(x, float)[idx][::-1], np.asarray(y, float)[idx][::-1]  # y ascending
    if target > fy[-1]:
        return float("nan")
    if target <= fy[0]:
        return float(fx[0])
    j = int(np.searchsorted(fy, target))
    w = (target - fy[j - 1]) / (fy[j] - fy[j - 1])
    return float(fx[j - 1] + w * (fx[j] - fx[j - 1]))
