"""A diagnostic read after held-out-11 ran (not a score): each kept run against its own
simulation. Every kept run was sent with jobs of its own seed (``--arrival-seeds per-run``)
and is simulated on the same seed and its trace draw (``grid.run_trace``), so a run's
arrivals, prompt order and sampled answers' acceptance are shared by both sides; the ratio
sim / real - 1 per run leaves out what the two share. Per cell: the unpaired real spread
(the grid's interval is on it) against the spread and 95% interval of the paired errors.

    python reports/llama-cpp-v4/held-out-11/paired.py

Writes ``paired-runs.csv`` (one row per kept run) and ``paired-cells.csv`` beside this
script; about two minutes of simulation on a 2-core machine.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from specsim.fidelity.llama import trace_path
from specsim.fidelity.llama.config import (
    LlamaValidationConfig,
    SpecSetting,
    profile_file,
    profile_key,
)
from specsim.fidelity.llama.grid import cell_sim, logged_seed, run_trace
from specsim.fidelity.repeats import median_interval
from specsim.sim.cost.profiles import read_profile_csv
from specsim.trace.io import read_trace

HERE = Path(__file__).resolve().parent
METRICS = {"throughput_tok_s": "throughput", "tpot_ms_mean": "tpot_mean"}


def load_config() -> LlamaValidationConfig:
    conf = json.loads((HERE / "config.json").read_text())
    fields = LlamaValidationConfig.__dataclass_fields__
    kw = {k: tuple(v) if isinstance(v, list) else v for k, v in conf.items() if k in fields}
    kw["prompts"] = tuple(conf["prompts"])
    kw["out"] = HERE
    kw["profile"] = None
    return LlamaValidationConfig(**kw)


def main() -> int:
    cfg = load_config()
    runs = pd.read_csv(HERE / "runs.csv")
    runs = runs[~runs["warmup"].astype(bool)]
    draws = {(s.name, float(t)): tuple(read_trace(trace_path(HERE, s.name, t, k))
                                       for k in range(cfg.trace_draws))
             for s in cfg.settings for t in cfg.temperatures}  # fmt: skip
    costs = {}
    for s in cfg.settings:
        for t in cfg.temperatures:
            key = profile_key(s.name, t)
            costs[key] = read_profile_csv(HERE / profile_file(key))
    rows = []
    for _, r in runs.iterrows():
        c = None if pd.isna(r["concurrency"]) else int(r["concurrency"])
        rate = None if pd.isna(r["rate"]) else float(r["rate"])
        t = float(r["temperature"])
        tr = run_trace(draws[(r["spec"], t)], r)
        sim = cell_sim(cfg, SpecSetting.parse(r["spec"]), tr, costs[profile_key(r["spec"], t)],
                       c, rate, None, (logged_seed(cfg, r),))  # fmt: skip
        row = {"spec": r["spec"], "temperature": t, "load": f"C={c}" if c else f"{rate:g}/s",
               "repeat": int(r["repeat"])}  # fmt: skip
        for m, short in METRICS.items():
            row[f"real_{short}"] = float(r[m])
            row[f"sim_{short}"] = float(sim[m])
            row[f"paired_err_{short}"] = float(sim[m]) / float(r[m]) - 1.0
        rows.append(row)
    per_run = pd.DataFrame(rows)
    per_run.to_csv(HERE / "paired-runs.csv", index=False)
    cells = []
    for key, g in per_run.groupby(["spec", "temperature", "load"], sort=False):
        cell = dict(zip(["spec", "temperature", "load"], key, strict=True))
        for short in METRICS.values():
            real = g[f"real_{short}"].to_numpy()
            ratio = 1.0 + g[f"paired_err_{short}"].to_numpy()
            iv = median_interval(ratio)
            cell[f"real_spread_{short}"] = (real.max() - real.min()) / np.median(real)
            cell[f"paired_median_err_{short}"] = iv.median - 1.0
            cell[f"paired_spread_{short}"] = ratio.max() - ratio.min()
            cell[f"paired_ci_{short}"] = iv.half_width()
        cells.append(cell)
    table = pd.DataFrame(cells)
    table.to_csv(HERE / "paired-cells.csv", index=False)
    pd.set_option("display.width", 200)
    print(table.round(3).to_string(index=False))
    for short in METRICS.values():
        err = table[f"paired_median_err_{short}"].abs().median()
        print(f"{short}: median |paired error| {err:.3f}; "
              f"median real spread {table[f'real_spread_{short}'].median():.3f}, "
              f"paired spread {table[f'paired_spread_{short}'].median():.3f}; cells with a "
              f"paired interval within 10%: {(table[f'paired_ci_{short}'] <= 0.10).sum()} of "
              f"{len(table)}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
