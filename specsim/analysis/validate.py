"""Fidelity: the simulator against the real engine, cell by cell, on the same prompts and load.

For each (policy, concurrency) cell the real engine (:mod:`specsim.torch_engine.engine`) serves the
trace's prompts closed-loop, and the simulator replays the recorded trace of the same prompts
with the same policy, concurrency, job order (the same seeded workload) and the cost profile
measured from the engine's own components (:mod:`specsim.torch_engine.profile`). The table
holds both sides' throughput, mean / p90 TPOT, mean TTFT and tau, and the relative error
``(sim - real) / real``. Only torch-free code lives here; the engine is imported lazily.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from specsim.errors import SpecsimError

METRICS = ("throughput_tok_s", "tpot_ms_mean", "tpot_ms_p90", "ttft_ms_mean", "tau")
GOAL = {"throughput_tok_s": 0.05, "tpot_ms_mean": 0.05}  # |relative error| targets (issue 6)


@dataclass(frozen=True)
class Cell:
    policy: str
    concurrency: int


def cell_metrics(summary: dict, requests: pd.DataFrame) -> dict[str, float]:
    """The compared metrics of one run (sim or real), from the shared metric definitions."""
    tpot = requests["tpot_ms"].to_numpy(np.float64)
    tpot = tpot[np.isfinite(tpot)]
    return {
        "throughput_tok_s": float(summary["throughput_tok_s"]),
        "tpot_ms_mean": float(summary["tpot_ms_mean"]),
        "tpot_ms_p90": float(np.percentile(tpot, 90)) if tpot.size else float("nan"),
        "ttft_ms_mean": float(summary["ttft_ms_mean"]),
        "tau": float(summary["tau"]),
    }


def compare(real: dict[str, float], sim: dict[str, float]) -> dict[str, float]:
    """Flat row: real_X, sim_X and err_X = (sim - real) / real for every metric."""
    row: dict[str, float] = {}
    for m in METRICS:
        r, s = real[m], sim[m]
        row[f"real_{m}"] = r
        row[f"sim_{m}"] = s
        row[f"err_{m}"] = (s - r) / r if r and np.isfinite(r) and np.isfinite(s) else float("nan")
    return row


def load_adjusted(row: dict, slow: float) -> dict[str, float]:
    """Errors after scaling the simulated times by the measured machine slowdown of the cell
    (a diagnostic column, reported next to the raw error, never instead of it)."""
    out = {}
    for m, inverse in (
        ("throughput_tok_s", True),
        ("tpot_ms_mean", False),
        ("tpot_ms_p90", False),
        ("ttft_ms_mean", False),
    ):
        sim = row[f"sim_{m}"] / slow if inverse else row[f"sim_{m}"] * slow
        real = row[f"real_{m}"]
        out[f"adj_err_{m}"] = (sim - real) / real if real else float("nan")
    return out


def parse_grid(policies: str, concurrency: str) -> list[Cell]:
    pols = [p.strip() for p in policies.split(",") if p.strip()]
    try:
        conc = [int(c) for c in concurrency.split(",") if c.strip()]
    except ValueError:
        raise SpecsimError(
            f"--concurrency must be integers like 1,2,4,8, got {concurrency!r}"
        ) from None
    if not pols or not conc or min(conc) < 1:
        raise SpecsimError("give at least one policy and positive concurrency levels")
    from specsim.policies.base import get_policy

    for p in pols:
        get_policy(p)  # a typo fails now, in one line, not after the profile
    return [Cell(p, c) for p in pols for c in conc]


def run_validation(
    *,
    trace_path: Path,
    prompt_specs: list[str],
    cells: list[Cell],
    out_dir: Path,
    target_spec: str = "smollm2",
    drafter_spec: str = "ngram",
    requests: int | None = None,
    max_new_tokens: int = 64,
    profile: str | None = None,
    profile_contexts: tuple[int, ...] = (64, 256, 512),
    profile_batches: tuple[int, ...] | None = None,
    repeats: int = 5,
    layout: str = "flat",
    seed: int = 0,
    prefill_budget: int = 16384,
    force: bool = False,
    device: str = "cpu",
    log: Any = None,
) -> pd.DataFrame:
    """Run the grid; write table, step logs, profile and config under ``out_dir``."""
    from specsim.progress import Progress
    from specsim.record.models import load_target, prompt_ids
    from specsim.record.prompts import load_many
    from specsim.sim.profiles import get_profile, write_profile_csv
    from specsim.sim.simulate import replay
    from specsim.sim.workload import synthetic
    from specsim.torch_engine.engine import EngineConfig, RealEngine
    from specsim.torch_engine.profile import DEFAULT_B, measure_profile
    from specsim.torch_engine.proposers import make_proposer
    from specsim.trace.io import read_trace

    say = log or (lambda msg: None)
    out_dir.mkdir(parents=True, exist_ok=True)
    table_path = out_dir / "fidelity.csv"
    if table_path.exists() and not force:
        raise SpecsimError(f"{table_path} exists; pass --force to overwrite it")
    t_start = time.perf_counter()
    target = load_target(target_spec, device)
    proposer, drafter_name = make_proposer(drafter_spec, target)
    prompts = load_many(prompt_specs)
    ids = [prompt_ids(target.tokenizer, p.text) for p in prompts]
    if not trace_path.exists():
        say(f"recording {trace_path} ({len(prompts)} prompts, {max_new_tokens} new tokens)")
        _record(target, proposer, drafter_name, prompts, trace_path, max_new_tokens, seed)
    trace = read_trace(trace_path)
    if trace.meta.get("drafter") != drafter_name:
        raise SpecsimError(
            f"{trace_path} was recorded with drafter {trace.meta.get('drafter')!r}, not "
            f"{drafter_name!r}; pass the same --drafter or another --trace"
        )
    if float(trace.meta.get("temperature", "0")) != 0:
        raise SpecsimError(f"{trace_path} is not greedy (temperature 0); validation replays T=0")
    rid = [int(r) for r in trace.request_ids]
    if max(rid) >= len(ids):
        raise SpecsimError(
            f"{trace_path} has request ids up to {max(rid)} but --prompts gives {len(ids)} "
            "prompts; pass the prompts it was recorded on"
        )
    by_trace = [ids[i] for i in rid]
    lens = np.array([len(p) for p in by_trace])
    if not np.array_equal(lens, trace.prompt_len.astype(np.int64)):
        raise SpecsimError(
            f"{trace_path}'s prompt lengths differ from --prompts {prompt_specs}; pass the "
            "prompts it was recorded on"
        )
    n_jobs = requests or trace.n_requests
    if profile:
        cost = get_profile(profile)
        prof_steps = prof_req = None
    else:
        from specsim.policies.base import get_policy

        say("measuring the engine's cost profile")
        longest = int(lens.max() + trace.output_len.max())
        batches = profile_batches or DEFAULT_B
        grid = sorted(profile_contexts)
        ctxs = tuple(c for c in grid if c < longest) + tuple(c for c in grid if c >= longest)[:1]
        prof = measure_profile(
            target.model,
            proposer,
            get_policy("hw-aware"),
            name=f"engine-{target.name}",
            batch_tokens=batches,
            contexts=ctxs,
            draft_context=int(np.median(lens + trace.output_len // 2)),
            repeats=repeats,
            layout=layout,
            seed=seed,
            limits={"prefill_budget": prefill_budget},
        )
        cost = prof.cost
        prof_steps, prof_req = prof.steps, prof.per_request
        write_profile_csv(cost, out_dir / "profile.csv", force=True)
        prof_steps.to_csv(out_dir / "profile_points.csv", index=False)
        prof_req.to_csv(out_dir / "profile_per_request.csv", index=False)
        say("timing flat against padded verification batches")
        layouts_table(target.model, int(lens.max()), repeats).to_csv(
            out_dir / "layouts.csv", index=False
        )
    rows, step_frames = [], []
    eos = target.eos_ids
    from specsim.torch_engine.profile import probe_ms

    probe_pts = tuple((int(cost.context_tokens[0]) if cost.is_2d else 64, b) for b in (1, 8))
    probe_ref = [float(cost.step_time(b, c)) * 1000.0 for c, b in probe_pts]
    with Progress(len(cells), "validate", " cells") as bar:
        for cell in cells:
            from specsim.policies.base import get_policy

            pol = get_policy(cell.policy)
            wl = synthetic(trace, concurrency=cell.concurrency, requests=n_jobs, seed=seed)
            cfg = EngineConfig(
                seed=seed,
                layout=layout,
                max_running=cell.concurrency,
                kv_tokens=cost.kv_tokens,
                prefill_budget=cost.prefill_budget,
                eos_ids=tuple(eos),
            )
            load0 = os.getloadavg()[0]
            before = probe_ms(target.model, probe_pts)
            real = RealEngine(target.model, proposer, pol, cost, by_trace, wl, cfg).run()
            after = probe_ms(target.model, probe_pts)
            load1 = os.getloadavg()[0]
            # machine speed during the cell relative to profiling time (>1: slower now)
            slow = float(np.mean((np.asarray(before) + np.asarray(after)) / 2 / probe_ref))
            sim = replay(
                trace,
                pol,
                concurrency=cell.concurrency,
                requests=n_jobs,
                profile=cost,
                seed=seed,
                record_tokens=False,
            )
            want = trace.output_len[real.raw.job_trace]
            row = {
                "policy": pol.name,
                "concurrency": cell.concurrency,
                "jobs": int(real.raw.job_trace.shape[0]),
                "length_mismatch": int(np.sum(real.raw.output_len != want)),
                **compare(
                    cell_metrics(real.summary, real.requests),
                    cell_metrics(sim.summary, sim.requests),
                ),
                "real_steps": int(real.summary["engine_steps"]),
                "sim_steps": int(sim.summary["engine_steps"]),
                "real_draft_share": float(
                    real.steps["draft_s"].sum() / real.steps["duration_s"].sum()
                ),
                "loadavg_1min": round((load0 + load1) / 2, 2),
                "slowdown_vs_profile": round(slow, 4),
            }
            row.update(load_adjusted(row, slow))
            rows.append(row)
            st = real.steps.copy()
            st.insert(0, "concurrency", cell.concurrency)
            st.insert(0, "policy", pol.name)
            step_frames.append(st)
            bar.update(1)
            say(_cell_line(row))
    table = pd.DataFrame(rows)
    _atomic_csv(table, table_path)
    _atomic_parquet(pd.concat(step_frames, ignore_index=True), out_dir / "engine_steps.parquet")
    from specsim.record.models import threads_in_use

    config = {
        "trace": str(trace_path),
        "prompts": prompt_specs,
        "target": target.name,
        "drafter": drafter_name,
        "policies": sorted({c.policy for c in cells}),
        "concurrency": sorted({c.concurrency for c in cells}),
        "requests": n_jobs,
        "max_new_tokens": max_new_tokens,
        "profile": profile or str(out_dir / "profile.csv"),
        "layout": layout,
        "seed": seed,
        "torch_threads": threads_in_use(),
        "cpu_count": os.cpu_count(),
        "elapsed_s": round(time.perf_counter() - t_start, 1),
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return table


def layouts_table(model: Any, prompt_len: int, repeats: int) -> pd.DataFrame:
    """Flat against padded verification: decode-only batches and a batch with a prefill."""
    from specsim.torch_engine.profile import compare_layouts

    shapes = {
        "8 decodes, 1-8 tokens": (1, 3, 5, 8, 2, 6, 1, 4),
        "4 decodes of 8 tokens": (8, 8, 8, 8),
        "1 prefill + 3 decodes": (prompt_len, 1, 4, 8),
    }
    rows = []
    for name, lens in shapes.items():
        r = compare_layouts(model, lens, repeats=repeats)
        rows.append(
            {
                "batch": name,
                "tokens": int(r["tokens"]),
                "padded_rows": int(r["padded_rows"]),
                "flat_ms": r["flat"],
                "padded_ms": r["padded"],
                "padded_over_flat": r["padded"] / r["flat"],
            }
        )
    return pd.DataFrame(rows)


def _cell_line(r: dict) -> str:
    return (
        f"{r['policy']:>10} C={r['concurrency']}: throughput real "
        f"{r['real_throughput_tok_s']:.1f} sim {r['sim_throughput_tok_s']:.1f} "
        f"({100 * r['err_throughput_tok_s']:+.1f}%), TPOT {r['real_tpot_ms_mean']:.1f}/"
        f"{r['sim_tpot_ms_mean']:.1f} ms ({100 * r['err_tpot_ms_mean']:+.1f}%), "
        f"tau {r['real_tau']:.2f}/{r['sim_tau']:.2f}"
    )


def _record(target, proposer, name, prompts, path, max_new_tokens, seed) -> None:  # type: ignore[no-untyped-def]
    from specsim.record.recorder import RecordConfig, record

    drafter = getattr(proposer, "drafter", None)
    if drafter is None:  # n-gram
        from specsim.record.ngram import NgramDrafter

        drafter = NgramDrafter(n=proposer.n, block_size=proposer.gamma)
    path.parent.mkdir(parents=True, exist_ok=True)
    record(
        target, drafter, name, prompts, path, RecordConfig(max_new_tokens=max_new_tokens, seed=seed)
    )


def _atomic_csv(df: pd.DataFrame, path: Path) -> None:
    from specsim.outputs import atomic

    with atomic(path) as tmp:
        df.to_csv(tmp, index=False, float_format="%.6g")


def _atomic_parquet(df: pd.DataFrame, path: Path) -> None:
    from specsim.outputs import write_table

    write_table(df, path)


def fidelity_markdown(table: pd.DataFrame) -> str:
    """The README table: real, sim and relative error per cell."""
    lines = [
        "| policy | C | throughput real / sim (tok/s) | err | mean TPOT real / sim (ms) | err "
        "| p90 TPOT err | TTFT err | tau real / sim | machine slowdown | load-adjusted err "
        "throughput / TPOT |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in table.iterrows():
        lines.append(
            f"| {r.policy} | {r.concurrency} | {r.real_throughput_tok_s:.1f} / "
            f"{r.sim_throughput_tok_s:.1f} | {100 * r.err_throughput_tok_s:+.1f}% | "
            f"{r.real_tpot_ms_mean:.1f} / {r.sim_tpot_ms_mean:.1f} | "
            f"{100 * r.err_tpot_ms_mean:+.1f}% | {100 * r.err_tpot_ms_p90:+.1f}% | "
            f"{100 * r.err_ttft_ms_mean:+.1f}% | {r.real_tau:.2f} / {r.sim_tau:.2f} | "
            f"{r.slowdown_vs_profile:.2f} | {100 * r.adj_err_throughput_tok_s:+.1f}% / "
            f"{100 * r.adj_err_tpot_ms_mean:+.1f}% |"
        )
    return "\n".join(lines)


def plot_fidelity(table: pd.DataFrame, path: Path) -> Path:
    """Sim against real: throughput and mean TPOT, one marker per policy, y = x dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4))
    panels = (("throughput_tok_s", "throughput (tok/s)"), ("tpot_ms_mean", "mean TPOT (ms)"))
    from specsim.analysis.palette import policy_style

    for ax, (m, label) in zip(axes, panels, strict=True):
        for pol, grp in table.groupby("policy", sort=False):
            st = policy_style(str(pol))  # the colour and marker every other figure uses
            ax.scatter(
                grp[f"real_{m}"],
                grp[f"sim_{m}"],
                marker=st.marker or "o",
                color=st.color,
                label=pol,
                s=40,
                zorder=3,
            )
            for _, r in grp.iterrows():
                ax.annotate(
                    f"C={r.concurrency}",
                    (r[f"real_{m}"], r[f"sim_{m}"]),
                    fontsize=7,
                    xytext=(3, 3),
                    textcoords="offset points",
                )
        lo = float(min(table[f"real_{m}"].min(), table[f"sim_{m}"].min())) * 0.9
        hi = float(max(table[f"real_{m}"].max(), table[f"sim_{m}"].max())) * 1.1
        xs = np.array([lo, hi])
        ax.plot(xs, xs, "k--", lw=1, label="sim = real")
        ax.fill_between(xs, xs * 0.95, xs * 1.05, color="0.85", label="within 5%", zorder=0)
        ax.set_xlim(lo, hi)
        ax.set_ylim(lo, hi)
        ax.set_xlabel(f"real engine: {label}")
        ax.set_ylabel(f"simulator: {label}")
        ax.set_title(label.split(" (")[0] + ": simulated vs measured")
        ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    from specsim.outputs import atomic

    with atomic(path) as tmp:
        fig.savefig(tmp, dpi=120, format=path.suffix.lstrip(".") or "png")
    plt.close(fig)
    return path
