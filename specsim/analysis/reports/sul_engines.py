"""The schedulers-under-load report's engine section: each engine's own DSpark rule (vLLM's
adaptive verification, TensorRT-LLM's confidence scheduling, llama.cpp's p-min cut) against the
best of specsim's lossless built-ins at every SLA point, and which one to deploy where.

An operator deploys their engine's rule, not a specsim policy; what they need from this report is
how far that rule is from the best lossless schedule on their kind of traffic, and at which SLA
it falls behind. SGLang's default static verify of G drafts is ``static:G`` (``full`` at the
block), so its rows are those policies' rows.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from specsim.analysis.frontier import Y

# specsim's own policy, shown beside the engines' rules for comparison (not ranked among them).
OWN = "auto"
# Not lossless, or not a schedule: never the reference a deployable rule is measured against.
NOT_REFERENCES = ("hw-aware-global", "oracle")


def engine_ratios(
    sla: pd.DataFrame, engines: list[str], reference: list[str], groups: dict[str, list[str]]
) -> pd.DataFrame:
    """One row per (group, trace, SLA target, engine rule): its throughput per GPU at the SLA
    over the best reference policy's there (0 where the rule cannot reach an SLA the best one
    reaches); points no reference reaches are dropped (nothing to compare)."""
    group_of = {t: g for g, members in groups.items() for t in members}
    wide = sla.pivot_table(index=["trace", "sla_tps"], columns="policy", values=Y, dropna=False)
    refs = [p for p in reference if p in wide.columns]
    best = wide[refs].max(axis=1)
    rows = []
    for (trace, target), b in best.items():
        if not np.isfinite(b) or b <= 0:
            continue
        for e in engines:
            v = wide.loc[(trace, target), e] if e in wide.columns else np.nan
            rows.append(
                {
                    "group": group_of.get(trace, "recorded"),
                    "trace": trace,
                    "sla_tps": float(target),
                    "rule": e,
                    "best reference": wide.loc[(trace, target), refs].astype(float).idxmax(),
                    "ratio": float(v / b) if np.isfinite(v) else 0.0,
                }
            )
    return pd.DataFrame(rows)


def engine_summary(ratios: pd.DataFrame) -> pd.DataFrame:
    """Per (group, rule): median and worst ratio to the best lossless built-in, the share of SLA
    points within 2% of it, and the points it cannot reach at all."""
    out = (
        ratios.groupby(["group", "rule"], sort=False)["ratio"]
        .agg(
            points="size",
            median="median",
            worst="min",
            within_2pct=lambda r: float((r >= 0.98).mean()),
            cannot_reach=lambda r: int((r == 0).sum()),
        )
        .reset_index()
    )
    return out.rename(
        columns={
            "median": "median / best",
            "worst": "worst / best",
            "within_2pct": "share within 2%",
            "cannot_reach": "SLA points it cannot reach",
        }
    )


def deploy_lines(summary: pd.DataFrame, ratios: pd.DataFrame, targets: list[float]) -> list[str]:
    """'Which to deploy where', from the numbers: per trace group the rule with the best median
    ratio, and the tightest SLA where each rule still holds within 2% of the best everywhere."""
    lines = ["### Which engine rule to deploy where", ""]
    for group, g in summary.groupby("group", sort=False):
        own = g[g["rule"] == OWN]
        g = g[g["rule"] != OWN].sort_values(["median / best", "worst / best"], ascending=False)
        if g.empty:
            continue
        top = g.iloc[0]
        rest = ", ".join(
            f"`{r['rule']}` {r['median / best']:.3f}" for _, r in g.iloc[1:].iterrows()
        )
        mine = (
            f" (specsim's `{OWN}`: median {own['median / best'].iloc[0]:.3f}, worst "
            f"{own['worst / best'].iloc[0]:.3f})"
            if not own.empty
            else ""
        )
        lines.append(
            f"- {group} traces: `{top['rule']}` (median {top['median / best']:.3f} of the best "
            f"lossless built-in over {int(top['points'])} SLA points, worst "
            f"{top['worst / best']:.3f}); then {rest}{mine}."
        )
    for rule, r in ratios.groupby("rule", sort=False):
        held = [t for t in sorted(targets) if (r[r["sla_tps"] == t]["ratio"] >= 0.98).all()]
        where = (
            f"within 2% of the best at every trace for SLA {', '.join(f'{t:g}' for t in held)} "
            "tok/s/user"
            if held
            else "not within 2% of the best at every trace for any SLA target"
        )
        lines.append(f"- `{rule}`: {where}.")
    return [*lines, ""]


def engine_section(
    ctx,  # noqa: ANN001 - ReportContext
    sla: pd.DataFrame,
    groups: dict[str, list[str]],
    targets: list[float],
    policies: list[str],
) -> None:
    """Writes the section: the summary table, the per-point table and the deploy lines.
    ``policies``: the report's, the default reference (``engine_reference`` overrides)."""
    engines = [str(p) for p in ctx.get("engine_policies", kind=list)]
    own = [OWN] if OWN in set(sla["policy"]) else []  # specsim's own, for comparison
    reference = [
        str(p)
        for p in ctx.get("engine_reference", policies, kind=list)
        if str(p) not in (*engines, *own, *NOT_REFERENCES)
    ]
    ratios = engine_ratios(sla, [*engines, *own], reference, groups)
    if ratios.empty:
        return
    summary = engine_summary(ratios)
    ctx.md(
        "## The engines' own rules",
        "",
        "Each engine's DSpark rule as built into specsim from the engine's source "
        "(docs/policies.md cites file and commit): "
        + ", ".join(f"`{e}`" for e in engines)
        + (f", and specsim's own `{OWN}` for comparison" if own else "")
        + ". SGLang's default static verify of G "
        "drafts is `static:G` (`full` at the block), "
        "so its rows are those. At every (trace, SLA target) that some lossless built-in "
        f"reaches, each rule's throughput per GPU over the best of {', '.join(reference)} "
        "there (0 = the rule cannot reach that SLA).",
        "",
    )
    ctx.table(summary, "{:.3f}")
    per_point = ratios.pivot_table(
        index=["group", "trace", "sla_tps"], columns="rule", values="ratio"
    ).reset_index()
    per_point = per_point.merge(
        ratios.drop_duplicates(["trace", "sla_tps"])[["trace", "sla_tps", "best reference"]],
        on=["trace", "sla_tps"],
    )
    ctx.md("Per point (rule / best lossless built-in; the best named):", "")
    ctx.table(per_point, "{:.3f}")
    ctx.md(*deploy_lines(summary, ratios, targets))
