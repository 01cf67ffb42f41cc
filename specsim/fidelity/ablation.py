"""What each cost term buys: a finished grid's cells replayed with each term of the measured
profile removed (torch-free, seconds), scored against the same real runs (``terms.csv``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd


def _draft_plus(cost, base_ms: float, per_request_ms: float, linear: bool = False) -> dict:  # type: ignore[no-untyped-def]
    """Profile fields that add ``base_ms + per_request_ms R`` to drafting: on the measured draft
    curve when there is one (and ``linear`` is False), else on its straight line."""
    if cost.draft_curve and not linear:
        return {
            "draft_curve": tuple((r, m + base_ms + per_request_ms * r) for r, m in cost.draft_curve)
        }
    return {
        "draft_curve": (),
        "draft_base_ms": cost.draft_base_ms + base_ms,
        "draft_per_request_ms": cost.draft_per_request_ms + per_request_ms,
    }


def term_variants(cost):  # type: ignore[no-untyped-def]
    """The measured profile without each engine term, the term folded back the way the v1
    cost model charged it: what each term buys is the error it removes. A measured overhead
    curve is also scored against the forms it replaced (the step's residual at each R, with
    the engine's drafting and with v3's modelled one, and v2's line), and a measured draft
    curve against the straight line it replaced."""
    from dataclasses import replace

    from specsim.sim.cost_profiles import parse_curve

    dctx = float(cost.meta.get("draft_context", 128))
    win = cost.draft_context_window or dctx
    ctx_ms = cost.draft_per_context_us * 1e-3 * min(dctx, win)
    base, slope = cost.step_overhead_ms, cost.verify_per_request_ms
    fit = cost.meta.get("overhead_linear_fit", "")  # the v2 line through the residual: "a + b R"
    if cost.overhead_curve and fit:
        a, _, b = fit.partition("+")
        base, slope = float(a), float(b.replace("R", ""))
    elif cost.overhead_curve:
        rr, mm = np.array(cost.overhead_curve, dtype=np.float64).T
        slope, base = np.polyfit(rr, mm, 1) if rr.size > 1 else (0.0, mm[0])
        base, slope = max(float(base), 0.0), max(float(slope), 0.0)
    no_pre = {"prefill_token_ms": 0.0}
    no_ctx = {"draft_per_context_us": 0.0, **_draft_plus(cost, 0.0, ctx_ms)}
    no_over = {"overhead_curve": (), "verify_per_request_ms": 0.0, "step_overhead_ms": 0.0}
    no_req = {**no_over, **_draft_plus(cost, base, slope)}
    v1 = {**no_pre, **no_over, "draft_per_context_us": 0.0}
    v1.update(_draft_plus(cost, base, ctx_ms + slope, linear=True))
    out = {"full model": cost}
    if cost.draft_curve:
        out["drafting as a straight line (v3: draft_base + draft_per_request R)"] = replace(
            cost, draft_curve=()
        )
    if cost.overhead_curve:
        for key, label in (
            ("overhead_engine_curve", "loop overhead as the engine's step residual at each R "
             "(step - engine drafting - table)"),
            ("overhead_residual_curve", "loop overhead as the residual at each R (step - "
             "modelled draft - table)"),
        ):  # fmt: skip
            if cost.meta.get(key, ""):
                out[label] = replace(cost, overhead_curve=parse_curve(cost.meta[key], cost.name))
        if cost.accept_per_token_ms and cost.meta.get("overhead_k4_curve", ""):
            out["loop per request only, at 4 tokens a request (v5: no per-token term)"] = replace(
                cost,
                accept_per_token_ms=0.0,
                overhead_curve=parse_curve(cost.meta["overhead_k4_curve"], cost.name),
            )
        out["loop overhead as a straight line (v2: step_overhead + verify_per_request R)"] = (
            replace(cost, overhead_curve=(), step_overhead_ms=base, verify_per_request_ms=slope)
        )
    out.update(
        {
            "without the prefill-token term (prompts through the table)": replace(cost, **no_pre),
            "without the draft-context term (at the typical context)": replace(cost, **no_ctx),
            "without the loop-overhead terms (v1: per decoding request, in drafting)": replace(
                cost, **no_req
            ),
            "v1 model (none of the three)": replace(cost, **v1),
        }
    )
    return out


def replay_cell(trace: Any, cell: Any, cfg: dict, cost: Any) -> dict[str, float]:
    """The simulated side of one row of a report's ``fidelity.csv`` (``cell``: its
    itertuple) under ``cost``: the same jobs, seed, load and policy as the grid replayed."""
    from specsim.fidelity.metrics import cell_metrics
    from specsim.sim.simulate import replay

    kw = {"requests": int(cell.jobs), "seed": int(cfg.get("seed", 0)), "record_tokens": False}
    if cell.concurrency > 0:
        kw["concurrency"] = int(cell.concurrency)
    else:
        kw["rate"] = float(cfg.get("rates_req_s", {})[f"{cell.drafter} {cell.policy} {cell.load}"])
    res = replay(trace, cell.policy, profile=cost, **kw)
    return cell_metrics(res.summary, res.requests)


def term_ablation(out_dir: Path) -> pd.DataFrame:
    """Replays every cell of a finished grid with each term removed (torch-free, seconds) and
    scores it against the same real runs: ``terms.csv``."""
    df = score_variants(out_dir, lambda drafter, cost: term_variants(cost))
    from specsim.outputs import atomic

    with atomic(out_dir / "terms.csv") as tmp:
        df.to_csv(tmp, index=False, float_format="%.6g")
    return df


def score_variants(out_dir: Path, variants) -> pd.DataFrame:  # type: ignore[no-untyped-def]
    """Every cell of a finished grid replayed under each cost model that ``variants(drafter,
    measured profile)`` returns ({name: CostModel}), scored against the same real runs: one
    row per (variant, cell) with its relative errors (torch-free)."""
    from specsim.sim.cost_profiles import read_profile_csv
    from specsim.trace.io import read_trace

    table = pd.read_csv(out_dir / "fidelity.csv")
    cfg = json.loads((out_dir / "config.json").read_text())
    rows = []
    for drafter, grp in table.groupby("drafter", sort=False):
        trace = read_trace(cfg["traces"][drafter])
        cost = read_profile_csv(out_dir / f"profile-{str(drafter).replace(':', '')}.csv")
        for name, variant in variants(str(drafter), cost).items():
            for r in grp.itertuples():
                m = replay_cell(trace, r, cfg, variant)
                slow = float(getattr(r, "slowdown_vs_profile", 1.0))
                slow = slow if np.isfinite(slow) else 1.0
                rows.append(
                    {
                        "variant": name,
                        "drafter": drafter,
                        "policy": r.policy,
                        "load": r.load,
                        "err_throughput_tok_s": m["throughput_tok_s"] / r.real_throughput_tok_s - 1,
                        "err_tpot_ms_mean": m["tpot_ms_mean"] / r.real_tpot_ms_mean - 1,
                        "err_ttft_ms_p50": m["ttft_ms_p50"] / r.real_ttft_ms_p50 - 1,
                        # the same with the simulated times scaled by the machine's measured
                        # speed during the cell (a diagnostic, as in fidelity.csv)
                        "adj_err_throughput_tok_s": m["throughput_tok_s"]
                        / slow
                        / r.real_throughput_tok_s
                        - 1,
                        "adj_err_tpot_ms_mean": m["tpot_ms_mean"] * slow / r.real_tpot_ms_mean - 1,
                    }
                )
    return pd.DataFrame(rows)


def _adj(g: pd.DataFrame) -> str:
    if "adj_err_throughput_tok_s" not in g:
        return "n/a | n/a"
    a, b = g["adj_err_throughput_tok_s"].abs(), g["adj_err_tpot_ms_mean"].abs()
    return (
        f"{int((a <= 0.05).sum())} / {int((b <= 0.05).sum())} | {100 * a.median():.1f}% / "
        f"{100 * b.median():.1f}%"
    )


def terms_markdown(df: pd.DataFrame) -> str:
    lines = [
        "| cost model | cells | throughput within 5% | median / worst abs error | mean TPOT within "
        "5% | median / worst | p50 TTFT within 10% | median | speed-adjusted: throughput / "
        "TPOT within 5% | median |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, g in df.groupby("variant", sort=False):
        t, p, f = (g[c].abs() for c in ("err_throughput_tok_s", "err_tpot_ms_mean",
                                        "err_ttft_ms_p50"))  # fmt: skip
        lines.append(
            f"| {name} | {len(g)} | {int((t <= 0.05).sum())} | {100 * t.median():.1f}% / "
            f"{100 * t.max():.1f}% | {int((p <= 0.05).sum())} | {100 * p.median():.1f}% / "
            f"{100 * p.max():.1f}% | {int((f <= 0.10).sum())} | {100 * f.median():.1f}% | "
            f"{_adj(g)} |"
        )
    return "\n".join(lines)
