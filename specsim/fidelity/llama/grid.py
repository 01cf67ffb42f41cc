"""The grid: real runs of every cell on llama-server, the simulator's prediction of each, and
the comparison (``fidelity.csv``: one row per cell).

A cell is (setting, temperature, load): a closed loop at C or Poisson arrivals at a rate.
The real side sends the cell's jobs (``specsim bench``'s generator, seeded: the simulator's job
order and arrival times) ``--repeats`` times; the simulated side replays the setting's trace at
that temperature with the same jobs, the profile fitted on the calibration runs, and the
server's capacity (serving model v2: ``max_running`` = slots, a step budget of ``-b`` tokens,
KV reserved per slot).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from specsim.fidelity.llama.config import LlamaValidationConfig, SpecSetting
from specsim.fidelity.llama.servers import limits, send
from specsim.fidelity.llama.traces import GridInputs
from specsim.serve.llama_trace import path_counts
from specsim.trace.model import Trace

# each compared metric and its short name in fidelity.csv's error columns (err_<short>_wall)
METRICS = {"throughput_tok_s": "throughput", "tpot_ms_mean": "tpot_mean",
           "ttft_ms_mean": "ttft_mean", "e2e_ms_mean": "e2e_mean",
           "steady_throughput_tok_s": "steady_throughput"}  # fmt: skip


def loads(cfg: LlamaValidationConfig) -> list[tuple[int | None, float | None]]:
    return [(c, None) for c in cfg.concurrency] + [(None, r) for r in cfg.rates]


def real_runs(
    cfg: LlamaValidationConfig,
    s: SpecSetting,
    srv,  # noqa: ANN001 - a started LlamaServer
    inputs: GridInputs,
    traces: dict[float, Trace],
    log: Callable[[str], None],
) -> list[dict[str, Any]]:
    """Every run of setting ``s``: repeats outermost, so a cell's repeats are minutes apart."""
    rows = []
    for rep in range(cfg.repeats):
        for t in cfg.temperatures:
            pred_d, pred_a = path_counts(traces[float(t)])
            ref = inputs.outputs[float(t)]
            for c, rate in loads(cfg):
                n = cfg.cell_requests(c)
                jobs, res, summary = send(srv, inputs.ids, inputs.lengths, temperature=t,
                                          seed=cfg.seed, concurrency=c, rate=rate,
                                          requests=n)  # fmt: skip
                ok = [(j, r) for j, r in zip(jobs, res, strict=True) if not r.error]
                same = sum(r.tokens == ref[j.trace_id] for j, r in ok)
                row = {"spec": s.name, "temperature": float(t), "concurrency": c, "rate": rate,
                       "repeat": rep, "requests": n, "failed": len(res) - len(ok),
                       "outputs_as_trace": same / max(len(ok), 1)}  # fmt: skip
                row.update({m: summary.get(m, np.nan) for m in METRICS})
                row["server_drafted"] = sum(r.draft_n or 0 for _, r in ok)
                row["server_accepted"] = sum(r.draft_accepted or 0 for _, r in ok)
                row["trace_drafted"] = int(sum(pred_d[j.trace_id] for j, _ in ok))
                row["trace_accepted"] = int(sum(pred_a[j.trace_id] for j, _ in ok))
                exact = sum((r.draft_n or 0, r.draft_accepted or 0)
                            == (pred_d[j.trace_id], pred_a[j.trace_id]) for j, r in ok)  # fmt: skip
                row["requests_counts_exact"] = exact / max(len(ok), 1)
                row["first_error"] = next((r.error for r in res if r.error), "")
                rows.append(row)
                load = f"C={c}" if c is not None else f"rate={rate:g}"
                log(f"  {s.name} T={t:g} {load} rep {rep}: {row['throughput_tok_s']:.1f} tok/s, "
                    f"TPOT {row['tpot_ms_mean']:.2f} ms, outputs as trace "
                    f"{row['outputs_as_trace']:.2f}")  # fmt: skip
    return rows


def simulate_cell(
    cfg: LlamaValidationConfig,
    s: SpecSetting,
    trace: Trace,
    cost: Any,
    concurrency: int | None,
    rate: float | None,
) -> dict[str, float]:
    """The simulator's summary of one cell."""
    from specsim.sim.simulate import replay

    kw: dict[str, Any] = {"concurrency": concurrency} if concurrency else {"rate": rate}
    with warnings.catch_warnings():
        # prompt tokens are priced per token (prefill_token_ms), not by the table, so a step
        # that prefills past the table's range is no extrapolation of it (the decode tokens
        # are checked against the range by the serving model itself)
        warnings.filterwarnings("ignore", message=".*covers token batches up to")
        res = replay(trace, s.policy, requests=cfg.cell_requests(concurrency), seed=cfg.seed,
                     profile=cost, serving="v2", kv="reserve", record_tokens=False,
                     **limits(cfg), **kw)  # fmt: skip
    out = dict(res.summary)
    # throughput over what specsim bench measures: first send to last finish (the simulator's
    # own counts from t = 0, which an open loop's first arrival is after)
    req = res.requests
    span = float(req["finish_s"].max() - req["arrival_s"].min())
    out["throughput_tok_s"] = float(req["output_tokens"].sum()) / span if span > 0 else np.nan
    return out


def compare(
    cfg: LlamaValidationConfig,
    runs: pd.DataFrame,
    traces: dict[tuple[str, float], Trace],
    costs: dict[float, Any],
) -> pd.DataFrame:
    """One row per cell: real mean and spread over the repeats, the simulator, signed errors."""
    rows = []
    keys = ["spec", "temperature", "concurrency", "rate"]
    for key, g in runs.groupby(keys, dropna=False, sort=False):
        spec, t, c, rate = key
        s = SpecSetting.parse(spec)
        c = None if pd.isna(c) else int(c)
        rate = None if pd.isna(rate) else float(rate)
        sim = simulate_cell(cfg, s, traces[(spec, float(t))], costs[float(t)], c, rate)
        row: dict[str, Any] = {"spec": spec, "temperature": t, "concurrency": c, "rate": rate,
                               "repeats": len(g)}  # fmt: skip
        for m, short in METRICS.items():
            real = g[m].to_numpy(np.float64)
            mean = float(np.nanmean(real)) if np.isfinite(real).any() else np.nan
            row[f"real_{m}"] = mean
            row[f"sim_{m}"] = float(sim.get(m, np.nan))
            row[f"err_{short}_wall"] = row[f"sim_{m}"] / mean - 1.0 if mean else np.nan
            if m in ("throughput_tok_s", "tpot_ms_mean"):
                row[f"spread_{short}"] = float((real.max() - real.min()) / mean)
        row["spread_real"] = max(row["spread_throughput"], row["spread_tpot_mean"])
        drafted, accepted = g["server_drafted"].sum(), g["server_accepted"].sum()
        row["real_accept_per_draft"] = accepted / drafted if drafted else np.nan
        v, a = sim.get("verified_draft_tokens", 0), sim.get("accepted_draft_tokens", 0)
        row["sim_accept_per_draft"] = a / v if v else np.nan
        # raw counts (the repeats' sums; the simulator's run once per repeat) for pooled rates
        row["real_drafted"], row["real_accepted"] = int(drafted), int(accepted)
        row["sim_drafted"], row["sim_accepted"] = int(v) * len(g), int(a) * len(g)
        row["real_drafted_per_request"] = drafted / g["requests"].sum()
        row["sim_drafted_per_request"] = v / max(sim.get("requests_completed", 1), 1)
        row["outputs_as_trace"] = float(g["outputs_as_trace"].mean())
        row["requests_counts_exact"] = float(g["requests_counts_exact"].mean())
        rows.append(row)
    return pd.DataFrame(rows)


def rankings(table: pd.DataFrame, metric: str = "throughput_tok_s") -> pd.DataFrame:
    """Per (temperature, load): the settings ranked by the real and by the simulated metric;
    a pair counts where the real difference exceeds both settings' real spread."""
    rows = []
    higher = metric.startswith("throughput")
    for key, g in table.groupby(["temperature", "concurrency", "rate"], dropna=False):
        g = g.reset_index(drop=True)
        real, sim = g[f"real_{metric}"].to_numpy(), g[f"sim_{metric}"].to_numpy()
        spread = g["spread_real"].to_numpy() * np.abs(real)
        pairs = agree = 0
        for i in range(len(g)):
            for j in range(i + 1, len(g)):
                if abs(real[i] - real[j]) <= max(spread[i], spread[j]):
                    continue
                pairs += 1
                agree += int(np.sign(real[i] - real[j]) == np.sign(sim[i] - sim[j]))
        names = g["spec"].to_numpy()
        real_order = " > ".join(names[np.argsort(-real if higher else real)])
        sim_order = " > ".join(names[np.argsort(-sim if higher else sim)])
        rows.append({"temperature": key[0], "concurrency": key[1], "rate": key[2],
                     "real_order": real_order, "sim_order": sim_order,
                     "pairs_beyond_spread": pairs, "pairs_agree": agree})  # fmt: skip
    return pd.DataFrame(rows)
