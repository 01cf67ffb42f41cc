"""From the runs of a grid to its tables: per-run rows, per-cell rows (real mean and spread
against the simulation, on both clocks), step logs and every request's timeline."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from specsim.fidelity.config import Cell
from specsim.fidelity.metrics import METRICS, compare, load_adjusted
from specsim.fidelity.simulated import decompose


def assemble(grid, specs, results, sims, per, repeats, clock):  # type: ignore[no-untyped-def]
    """Per-run rows, per-cell rows (real mean and spread against sim, both clocks), step logs,
    the per-step decomposition and every request's timeline (real runs and simulation)."""
    runs, rows, frames, decomp, reqs = [], [], [], [], []
    by_cell: dict[Cell, list[int]] = {}
    for i, s in enumerate(specs):
        by_cell.setdefault(s.cell, []).append(i)
    for c in grid:
        idx = sorted(by_cell[c], key=lambda i: specs[i].repeat)
        res = [results[i] for i in idx]
        info = per[c.drafter]
        want = info["trace"].output_len
        mism = int(sum(np.sum(r["output_len"] != want[r["job_trace"]]) for r in res))
        for i, r in zip(idx, res, strict=True):
            runs.append(
                {
                    "drafter": c.drafter,
                    "policy": c.policy,
                    "load": c.load,
                    "repeat": specs[i].repeat,
                    **{f"{clock}_{k}": v for k, v in r["metrics"].items()},
                    **{f"wall_{k}": v for k, v in (r.get("wall_metrics") or {}).items()},
                    "run_cpu_s": r["cpu_s"],
                    "run_wall_s": r["wall_s"],
                    "slowdown": r["slowdown"],
                    "speed_factor": r["speed_factor"],
                }
            )
            st = r["steps"].copy()
            st.insert(0, "repeat", specs[i].repeat)
            st.insert(0, "load", c.load)
            st.insert(0, "concurrency", c.concurrency if c.concurrency is not None else -1)
            st.insert(0, "policy", c.policy)
            st.insert(0, "drafter", c.drafter)
            frames.append(st)
            reqs.append(request_rows(c, "real", specs[i].repeat, r.get("requests")))
        real = {m: float(np.mean([r["metrics"][m] for r in res])) for m in METRICS}
        row: dict[str, Any] = {
            "drafter": c.drafter,
            "policy": c.policy,
            "load": c.load,
            "concurrency": c.concurrency if c.concurrency is not None else -1,
            "rate_frac": c.rate_frac if c.rate_frac is not None else np.nan,
            "jobs": specs[idx[0]].jobs,
            "repeats": len(res),
            "length_mismatch": mism,
            **compare(real, sims[c]["metrics"]),
        }
        for m in ("throughput_tok_s", "tpot_ms_mean", "tpot_ms_p90", "ttft_ms_p50"):
            vals = np.array([r["metrics"][m] for r in res])
            row[f"spread_{m}"] = float((vals.max() - vals.min()) / vals.mean())
        if "wall_metrics" in res[0] and "wall_metrics" in sims[c]:
            wreal = {m: float(np.mean([r["wall_metrics"][m] for r in res])) for m in METRICS}
            wrow = compare(wreal, sims[c]["wall_metrics"])
            row.update({f"wall_{k}": v for k, v in wrow.items()})
        slow = float(np.mean([r["slowdown"] for r in res]))
        row["slowdown_vs_profile"] = slow
        row["speed_factor"] = float(np.mean([r["speed_factor"] for r in res]))
        row.update(load_adjusted(row, slow))
        row["real_steps"] = int(res[0]["engine_steps"])
        row["cpu_over_wall"] = float(np.mean([r["cpu_s"] / r["wall_s"] for r in res]))
        rows.append(row)
        decomp.append(decompose(c, res[0]["steps"], info["cost"], info["trace"]))
        reqs.append(request_rows(c, "sim", -1, sims[c].get("requests")))
    return runs, rows, frames, decomp, reqs


REQUEST_COLS = ("id", "prompt_len", "arrival_s", "admitted_s", "first_token_s", "ttft_ms")


def request_rows(c: Cell, side: str, repeat: int, frame: Any) -> pd.DataFrame:
    """A run's (or the simulation's, ``repeat`` -1) requests, tagged with their cell: where a
    request's TTFT went, queued (arrival to admission) or prefilling (admission to its first
    token), real against simulated (``specsim.fidelity.tables.ttft_misses_markdown``)."""
    if frame is None:
        return pd.DataFrame()
    out = frame[list(REQUEST_COLS)].copy()
    for k, v in (("repeat", repeat), ("side", side), ("load", c.load), ("policy", c.policy)):
        out.insert(0, k, v)
    out.insert(0, "drafter", c.drafter)
    return out
