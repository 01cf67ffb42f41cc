"""The paper-check report's page: its tables, figures (verified tokens per request, the
tornado) and discussion, from the frames :func:`specsim.analysis.reports.paper_check.build`
computes. Kept apart from the model and its evaluation so each file reads on its own."""

from __future__ import annotations

import math
import os
import textwrap
from typing import Any

import numpy as np
import pandas as pd

from specsim.analysis.report import ReportContext
from specsim.analysis.reports.paper_check import reach
from specsim.sim.deployments import DSPARK as SOURCE  # where each published figure comes from

PRED = "prediction (pre-registered)"
PRED_LH = "pre-registered: fixed x layers x hidden"
PRED_CONST = "pre-registered: fixed = Flash's"
FIRST = "first out-of-sample model (cf61cfa, no all-to-all), re-run on today's code"
NO_FLOOR = "post hoc (aae5168): + all-to-all bandwidth"
FIRST_COMMIT = "cf61cfa"


def write_page(ctx: ReportContext, v: dict[str, Any]) -> None:  # noqa: C901 - one linear page
    from specsim.sim.deployments import (
        FLASH_DEPLOYMENT,
        PRO_DEPLOYMENT,
        V4_FLASH,
        V4_PRO,
        all_to_all,
        latency_floor,
    )

    flash, pro, fit_table = v["flash"], v["pro"], v["fit_table"]
    o_fit, t_fit, pro_fit, conc = v["o_fit"], v["t_fit"], v["pro_fit"], v["conc"]
    fd, pdp = FLASH_DEPLOYMENT, PRO_DEPLOYMENT
    fa, pa, fab = all_to_all(fd), all_to_all(pdp), fd.fabric
    fl, llb = latency_floor(fab), fab.ll_bench
    ctx.md(
        "## What is sourced, what is fitted",
        "",
        "Every physical parameter comes from `specsim/sim/deployments.py`, each with its source "
        "(the `v4-pro-like` profile header lists them). Derived, not fitted:",
        "",
        "| | V4-Flash | V4-Pro | source |",
        "|---|---|---|---|",
        f"| total / active params | {V4_FLASH.total_params.value / 1e9:g}B / "
        f"{V4_FLASH.active_params.value / 1e9:g}B | {V4_PRO.total_params.value / 1e9:g}B / "
        f"{V4_PRO.active_params.value / 1e9:g}B | model cards |",
        f"| routed experts, top-k, layers, hidden | {V4_FLASH.routed_experts.value:g}, "
        f"{V4_FLASH.top_k.value:g}, {V4_FLASH.layers.value:g}, {V4_FLASH.hidden.value:g} | "
        f"{V4_PRO.routed_experts.value:g}, {V4_PRO.top_k.value:g}, {V4_PRO.layers.value:g}, "
        f"{V4_PRO.hidden.value:g} | NeMo AutoModel (Flash), model card (Pro) |",
        f"| bytes/param = download / params | {V4_FLASH.bytes_per_param:.3f} | "
        f"{V4_PRO.bytes_per_param:.3f} | ~160 GB / ~865 GB checkpoints (FP4 experts + FP8) |",
        f"| expert share of weights | {V4_FLASH.expert_share:.3f} | {V4_PRO.expert_share:.3f} | "
        "from active = (1-s)P + sPk/E |",
        f"| KV bytes/token | {V4_FLASH.kv_bytes_per_token:,.0f} | "
        f"{V4_PRO.kv_bytes_per_token:,.0f} | V3.2 MLA x layers x 10% (V4 report) |",
        f"| GPUs (H20-class, 96 GB) | {fd.gpus} | {pdp.gpus} | whole nodes holding the weights "
        "in 90% of HBM |",
        f"| MTP-1 acceptance | {fd.mtp1_acceptance.value:g} | {pdp.mtp1_acceptance.value:g} | "
        "DeepSeek-V3 report: 85-90% |",
        f"| all-to-all bytes per token, expert and layer | {fa.bytes_per_copy:,.0f} | "
        f"{pa.bytes_per_copy:,.0f} | dispatch FP8 + 1 FP32 scale / 128 values, combine BF16 "
        "(DeepSeek-V3 report 3.3.3; DeepEP) |",
        f"| share of the top-k copies over NVLink / over NICs | {fa.nvlink_share:.3f} / "
        f"{fa.nic_share:.3f} | {pa.nvlink_share:.3f} / {pa.nic_share:.3f} | experts and tokens "
        "spread evenly over the GPUs, 8 per node |",
        f"| NVLink / NIC bandwidth per GPU, one way | {fab.nvlink_bw.value / 1e9:g} / "
        f"{fab.nic_bw.value / 1e9:g} GB/s | same | H20 NVLink 900 GB/s bidirectional; DeepEP's "
        "measured 2-node bottleneck (CX7 400 Gb/s, ~50 GB/s nominal; V3 report: IB 50 GB/s) |",
        f"| derived all-to-all per padded token: NVLink + NIC | {fa.nvlink_us:.2f} + "
        f"{fa.nic_us:.2f} us | {pa.nvlink_us:.2f} + {pa.nic_us:.2f} us | top-k x bytes x "
        "layers x share / (GPUs x bandwidth) |",
        f"| KV capacity (tokens) | {fd.kv_tokens / 1e6:,.0f}M | {pdp.kv_tokens / 1e6:,.0f}M | "
        "HBM x 90% - checkpoint, / KV bytes per token |",
        "| cross-node latency floor of one MoE layer's dispatch + combine | 0 (one node) | "
        f"{fl.dispatch_us:.1f} + {fl.combine_us:.1f} = {pa.floor_us_per_layer:.1f} us, x "
        f"{pa.layers} layers = **{pa.floor_ms:.2f} ms a step** | DeepEP's low-latency table "
        "([docs/legacy.md](https://github.com/deepseek-ai/DeepEP/blob/main/docs/legacy.md), H800 "
        f"+ CX7 400 Gb/s, {llb.tokens_per_gpu.value:g} tokens per GPU, hidden "
        f"{llb.hidden.value:g}, top-{llb.top_k.value:g}, FP8 dispatch / BF16 combine): EP 16 "
        f"(2 nodes of 8, Pro's layout) {llb.ep16_dispatch_us.value:g} / "
        f"{llb.ep16_combine_us.value:g} us, minus the bytes that cross the NICs at "
        f"{fab.nic_bw.value / 1e9:g} GB/s |",
        "",
        "Free (what physical facts leave open), fitted on V4-Flash only: the fixed step overhead "
        "and the per-padded-token overhead the roofline and the derived all-to-all miss "
        "(sampling, kernel gaps, all-to-all inefficiency). Carried to Pro by a stated "
        "rule: fixed overhead x layers ratio (61/43), per-token x layers x hidden ratio "
        f"({V4_PRO.layers.value * V4_PRO.hidden.value / (V4_FLASH.layers.value * V4_FLASH.hidden.value):.2f}). "  # noqa: E501
        "Also open and *not* fitted (held at `v4-flash-like`'s assumptions, varied below): GPU "
        "type (the paper says 'production GPUs'), bandwidth/compute derates (75% / 45%), max "
        "batch (512 requests), draft and scheduler costs. The derived all-to-all is not carried: "
        "each deployment gets its own from its node count, so Pro's traffic across its 2 nodes "
        "is charged at NIC bandwidth, and only Pro pays the cross-node latency floor (a fixed "
        "cost per step: each MoE layer's dispatch and combine wait for an RDMA round trip "
        "however few tokens they carry). **Correction** (found after the model was frozen for "
        "the pre-registered run, so the model keeps its floor): DeepEP's low-latency table is "
        "for kernels with *pure RDMA*, where every copy goes through a NIC, even to a GPU in the "
        "same node; its EP 8 row is 8 GPUs on 8 NICs, not an NVLink node, and its own bandwidth "
        "column (dispatch 98 / 63 GB/s, combine 127 / 74 GB/s at EP 8 / 16) is the same bytes "
        "over the same latencies: the table does not separate a floor from the transfer. The "
        f"{fl.dispatch_us:.1f} + {fl.combine_us:.1f} us charged is a reading (only the half of "
        f"the bytes that crosses nodes subtracted, at {fab.nic_bw.value / 1e9:g} GB/s), not a "
        "measurement; earlier versions of this report argued from an EP 8 'NVLink' floor that "
        "the table does not give. The tornado's `floor-0` row is the reading in which the "
        "table holds no floor beyond the transfer.",
        "",
        "Note: the shipped `v4-flash-like` profile (unchanged, golden tests depend on it) "
        "assumes FP8 weights (1.0 B/param); the checkpoints are FP4+FP8 (0.56 B/param). This "
        "report builds its own Flash profile from the facts and makes FP8 one of the "
        "sensitivity dimensions.",
        "",
        "Workloads (every number below is measured on these): MTP-1 = `static:1` on a "
        f"synthetic block-1 trace with position-1 acceptance {fd.mtp1_acceptance.value:g}; "
        "DSpark = `zos` (the paper's production form: lagged global budget, dynamic top-K) on "
        "a synthetic block-7 trace with the production survival prior a_1..a_7 = 0.78 ... 0.08 "
        f"(tau 3.29); {v['trace_req']} requests each (outputs lognormal, median 220 tokens), "
        f"closed loops at concurrency {', '.join(f'{c:g}' for c in conc)}, each with at least "
        f"max({v['min_req']}, 3C + 32) requests; throughput = steady-state throughput per GPU "
        "read off each Pareto frontier at the SLA.",
        "",
        "## Calibration on V4-Flash",
        "",
        f"Grid: fixed overhead {', '.join(f'{x:g}' for x in v['grid_o'])} ms x per-token "
        f"{', '.join(f'{x:g}' for x in v['grid_t'])} us ({len(fit_table)} settings); objective: "
        "squared log error of (1 + gain) at 80 and 120 tok/s/user. Best: "
        f"**{o_fit:g} ms fixed, {t_fit:g} us per padded token** plus the derived "
        f"{fa.total_us:.2f} us all-to-all (Pro by the rule: {pro_fit.overhead_ms:.1f} ms, "
        f"{pro_fit.per_token_us:.1f} us, plus its own {pa.total_us:.2f} us all-to-all).",
        "",
    )
    show = fit_table.sort_values("error").head(8).rename(columns={
        "overhead_ms": "fixed ms", "per_token_us": "per-token us", "step_ms_b1": "step ms B=1",
        "step_ms_b640": "step ms B=640", "gain_80": "gain % @80", "gain_120": "gain % @120",
        "error": "fit error"})  # fmt: skip
    ctx.md("The 8 best settings of the grid (all in `fit_grid.csv`):", "")
    ctx.table(show, "{:,.2f}")
    ctx.md("## Predicted against published", "")
    rows = []
    for dep, d, r, role in (
        ("V4-Flash", fd, flash, "fit"),
        ("V4-Pro", pdp, pro, PRED),
        ("V4-Pro", pdp, v["pro_lh"], PRED_LH),
        ("V4-Pro", pdp, v["pro_const"], PRED_CONST),
        ("V4-Pro", pdp, v["pro_no_a2a"], FIRST),
        ("V4-Pro", pdp, v["pro_no_floor"], NO_FLOOR),
    ):
        for i, sla in enumerate(d.sla_tps):
            g, pub = r[f"gain_{i}"], d.published_gain_pct[i]
            rows.append({"model": dep, "role": role, "SLA tok/s/user": sla,
                         "MTP-1 tok/s/GPU": r[f"mtp1_{i}"], "DSpark tok/s/GPU": r[f"zos_{i}"],
                         "simulated gain %": g, "published gain %": pub,
                         "error (pp)": g - pub,
                         "ratio (1+sim)/(1+pub)": (1 + g / 100) / (1 + pub / 100),
                         "per-user gain at MTP-1's throughput %": r[f"user_gain_{i}"],
                         "reach": reach(r, i)})  # fmt: skip
    pvp = pd.DataFrame(rows)
    ctx.table(pvp, "{:,.2f}")
    ctx.md(
        "Rows, same Flash fit throughout: the pre-registered prediction (the model frozen in "
        "`PREREGISTRATION.md` before this run: derived all-to-all bandwidth and cross-node "
        "floor, Pro's fixed cost x layers) and its two pre-registered alternative transfer "
        "rules; then the record: the first out-of-sample prediction (no derived all-to-all, "
        f"commit `{FIRST_COMMIT}`), which is this check's result, and the post hoc model with "
        "the all-to-all bandwidth but no floor. The pre-registered model is the third model; "
        "its four numbers were known when it was frozen, so only the alternative rules, the "
        "refitted tornado and the figures scored below are new. Published figures: "
        f"{SOURCE}. Throughput per GPU: Flash on {flash['gpus']} GPUs, Pro on {pro['gpus']}.",
        "",
    )
    v["pvp"] = pvp
    ctx.md("## Scorecard: every published figure, scored as pre-registered", "")
    ctx.table(_scorecard(v, pvp), "{}")
    ctx.md(
        "Rules (from `PREREGISTRATION.md`): a gain agrees when (1 + sim) / (1 + pub) is within "
        "[0.8, 1.25]; a per-user gain when it is inside the published range with 5 points of "
        "slack; the verification length when 4 <= verified <= 6 at every swept concurrency "
        "from 16 to below the paper's moderate-load limit. Flash's two gains are fitted: "
        "agreement there is expected, not evidence.",
        "",
    )
    # ---- (d) tokens verified per request
    curve = pd.concat([flash["curve"].assign(deployment="V4-Flash"),
                       pro["curve"].assign(deployment="V4-Pro")])  # fmt: skip
    zc = curve[curve["policy"] == "zos"]
    tv = zc.pivot_table(index="concurrency", columns="deployment",
                        values="verified_per_request").reset_index()  # fmt: skip
    ctx.md(
        "## Tokens verified per request against load",
        "",
        "DSpark (`zos`), tokens verified per request per step (bonus included, so MTP-1 is 2), "
        "production acceptance prior. Paper: about 4-6 below 200 concurrent requests (Flash; "
        "below 150 on Pro), fewer as load rises.",
        "",
    )
    ctx.table(tv.rename(columns={"concurrency": "concurrent requests"}), "{:,.2f}")
    ctx.md(_verified_summary(tv), "")
    ctx.figure(_verified_figure(zc), "verified.png",
               "Tokens verified per request per step by zos against load, with the paper's "
               "4-6 band")  # fmt: skip
    # ---- (e) tornado
    sens = v["sens"]
    if not sens.empty:
        ctx.md("## Sensitivity: which assumptions move the four numbers", "")
        ctx.figure(_tornado(sens, pvp), "tornado.png",
                   "Change of the simulated gain over MTP-1 (percentage points) when one "
                   "assumption moves, at the four SLA points; the red line is where the "
                   "published figure sits")  # fmt: skip
        sw = sens.assign(
            swing=(sens["gain_high"] - sens["gain_low"])
            .abs()
            .combine((sens["gain_low"] - sens["baseline_gain"]).abs(), max)
            .combine((sens["gain_high"] - sens["baseline_gain"]).abs(), max)
        )
        rank = sw.groupby("assumption")["swing"].max().sort_values(ascending=False)
        v["rank"] = rank
        tab = sens.assign(point=sens["deployment"] + " @" + sens["sla_tps"].map("{:g}".format))
        tab = tab[["assumption", "point", "baseline_gain", "low", "gain_low", "high", "gain_high"]]
        ctx.md("Gains (%) by variant (all in `sensitivity.csv`):", "")
        ctx.table(tab, "{:,.1f}")
        ctx.md("Largest swing (percentage points, any of the four points): " + "; ".join(
            f"{a}: {s:,.0f}" for a, s in rank.head(5).items()) + ".", "")  # fmt: skip
    probe = v["probe"]
    if not probe.empty:
        ctx.md(
            "## What V4-Pro would need",
            "",
            "The same prediction with Pro's whole fixed cost per step set by hand instead of "
            f"carried from the fit and derived ({pro_fit.overhead_ms:.1f} ms by the layers rule "
            f"+ {pa.floor_ms:.1f} ms cross-node floor = "
            f"{pro_fit.overhead_ms + pa.floor_ms:.1f} ms in the prediction); everything else "
            "unchanged. Not a fit: a probe of the size of the missing mechanism.",
            "",
        )
        ctx.table(probe, "{:,.1f}")
    ctx.md(*_discussion(v, pvp), "")
    lb, la = v["load_before"], v["load_after"]
    ctx.md(
        f"Simulation time for this report: {v['took']:.0f} s (all jobs, {os.cpu_count()} "
        f"cores); load average (1/5/15 min) before {lb[0]:.2f} / {lb[1]:.2f} / {lb[2]:.2f}, "
        f"after {la[0]:.2f} / {la[1]:.2f} / {la[2]:.2f}.",
        "",
    )


def _scorecard(v: dict[str, Any], pvp: pd.DataFrame) -> pd.DataFrame:
    """Every published figure against the pre-registered model, scored by the rules written
    down before the run (``reports/paper-check/PREREGISTRATION.md``)."""
    rows = []
    for _, r in pvp[pvp["role"].isin(["fit", PRED])].iterrows():
        g, pub = r["simulated gain %"], r["published gain %"]
        ratio = (1 + g / 100) / (1 + pub / 100)
        ok = math.isfinite(ratio) and 0.8 <= ratio <= 1.25
        rows.append({
            "figure": f"{r['model']} throughput gain at {r['SLA tok/s/user']:g} tok/s/user",
            "role": "fitted" if r["role"] == "fit" else "predicted",
            "published": f"{pub:+.0f}%", "simulated": f"{g:+.0f}%",
            "score": f"ratio {ratio:.2f}", "agrees": "yes" if ok else "no",
        })  # fmt: skip
    for name, res, lo, hi in (("V4-Flash", v["flash"], 60, 85), ("V4-Pro", v["pro"], 57, 78)):
        d = pvp[pvp["model"] == name]["SLA tok/s/user"].unique()
        for i, sla in enumerate(d):
            u = res[f"user_gain_{i}"]
            ok = math.isfinite(u) and lo - 5 <= u <= hi + 5
            rows.append({
                "figure": f"{name} per-user tok/s gain at MTP-1's throughput (SLA {sla:g})",
                "role": "predicted", "published": f"+{lo}-{hi}%",
                "simulated": f"{u:+.0f}%" if math.isfinite(u) else "n/a",
                "score": "in range +-5" if ok else "outside", "agrees": "yes" if ok else "no",
            })  # fmt: skip
    for name, res, lim in (("V4-Flash", v["flash"], 200), ("V4-Pro", v["pro"], 150)):
        z = res["curve"][res["curve"]["policy"] == "zos"]
        z = z[(z["concurrency"] >= 16) & (z["concurrency"] < lim)]
        inside = ((z["verified_per_request"] >= 4) & (z["verified_per_request"] <= 6)).mean()
        lo_v, hi_v = z["verified_per_request"].min(), z["verified_per_request"].max()
        rows.append({
            "figure": f"{name} tokens verified per request, 16 to <{lim} concurrent",
            "role": "predicted", "published": "about 4-6",
            "simulated": f"{lo_v:.1f}-{hi_v:.1f}",
            "score": f"{100 * inside:.0f}% of {len(z)} loads in 4-6",
            "agrees": "yes" if inside == 1.0 else "no",
        })  # fmt: skip
    return pd.DataFrame(rows)


def _verified_summary(tv: pd.DataFrame) -> str:
    """Where the simulated verification length sits in the paper's 4-6 band, per deployment."""
    parts = []
    for dep, lim in (("V4-Flash", 200), ("V4-Pro", 150)):
        if dep not in tv:
            continue
        c, val = tv["concurrency"].to_numpy(), tv[dep].to_numpy()
        band = c[(val >= 4) & (val <= 6)]
        below = c[val < 4]
        inside = f"{band.min():g}-{band.max():g}" if band.size else "none"
        first = f"from {below.min():g}" if below.size else "at no load swept"
        parts.append(f"{dep}: 4-6 at {inside} concurrent requests, below 4 {first} (paper: "
                     f"4-6 below {lim}, fewer above)")  # fmt: skip
    return "Simulated: " + "; ".join(parts) + "."


def _verified_figure(zc: pd.DataFrame):  # noqa: ANN202 - matplotlib Figure
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    ax.axhspan(4, 6, color="0.85", label="paper: 4-6 at moderate load")
    for dep, color, lim in (("V4-Flash", "tab:blue", 200), ("V4-Pro", "tab:orange", 150)):
        g = zc[zc["deployment"] == dep].sort_values("concurrency")
        ax.plot(g["concurrency"], g["verified_per_request"], "o-", color=color,
                label=f"{dep}, simulated zos")  # fmt: skip
        ax.axvline(lim, color=color, ls=":", label=f"{dep}: paper's 'moderate load' limit ({lim})")
    ax.axhline(2, color="k", ls="--", lw=1, label="MTP-1: 2 tokens (static)")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(ticker.ScalarFormatter())
    ax.set_xlabel("concurrent requests (closed loop)")
    ax.set_ylabel("tokens verified per request per step")
    ax.set_title("DSpark (zos) verification length under load, production acceptance")
    ax.set_ylim(0, 8)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return fig


def _tornado(sens: pd.DataFrame, pvp: pd.DataFrame):  # noqa: ANN202 - matplotlib Figure
    import matplotlib.pyplot as plt

    points = list(sens[["deployment", "sla_tps"]].drop_duplicates().itertuples(index=False))
    order = (sens.assign(s=(sens["gain_high"] - sens["baseline_gain"]).abs()
                         + (sens["gain_low"] - sens["baseline_gain"]).abs())
             .groupby("assumption")["s"].max().sort_values().index.tolist())  # fmt: skip
    # tall enough for every wrapped label (up to 4 lines of 7 pt) beside its two bars
    height = max(6.5, 0.62 * len(order) + 1.8)
    fig, axes = plt.subplots(1, len(points), figsize=(4.2 * len(points) + 3, height), sharey=True)
    y = np.arange(len(order))
    for ax, (dep, sla) in zip(np.atleast_1d(axes), points, strict=True):
        g = sens[(sens["deployment"] == dep) & (sens["sla_tps"] == sla)].set_index("assumption")
        g = g.reindex(order)
        lo = (g["gain_low"] - g["baseline_gain"]).to_numpy()
        hi = (g["gain_high"] - g["baseline_gain"]).to_numpy()
        ax.barh(y - 0.18, np.nan_to_num(lo), height=0.36, color="tab:blue",
                label="first variant (before '/'), Flash refitted")  # fmt: skip
        ax.barh(y + 0.18, np.nan_to_num(hi), height=0.36, color="tab:orange",
                label="second variant (after '/'), Flash refitted")  # fmt: skip
        ax.axvline(0, color="k", lw=0.8)
        name = "V4-Flash" if dep == "v4-flash" else "V4-Pro"
        pick = (pvp["model"] == name) & (pvp["SLA tok/s/user"] == sla)
        row = pvp[pick & pvp["role"].isin(["fit", PRED])].iloc[0]
        gap = row["published gain %"] - row["simulated gain %"]
        ax.axvline(gap, color="red", ls="--", label="published - simulated baseline")
        finite = np.concatenate([lo[np.isfinite(lo)], hi[np.isfinite(hi)], [gap, 1.0]])
        edge = 1.15 * float(np.abs(finite).max())
        ax.set_xlim(-edge, edge)
        # out of reach is not 0: MTP-1 unable to serve the SLA makes the gain unbounded
        # (arrow to the right), DSpark unable to serve it makes it -100% (arrow to the left)
        for off, col in ((-0.18, "reach_low"), (0.18, "reach_high")):
            for yi, why in zip(y, g[col].fillna("ok"), strict=True):
                if why == "ok":
                    continue
                sign = 1 if why == "MTP-1 cannot serve" else -1
                ax.annotate(
                    "",
                    xy=(sign * 0.97 * edge, yi + off),
                    xytext=(0, yi + off),
                    arrowprops={"arrowstyle": "->", "color": "0.25", "lw": 1.2},
                )
                ax.text(sign * 0.03 * edge, yi + off + 0.02, why, fontsize=6.5, color="0.15",
                        va="bottom", ha="left" if sign > 0 else "right")  # fmt: skip
        ax.set_title(f"{name} @ {sla:g} tok/s/user\nbaseline {row['simulated gain %']:+.0f}%, "
                     f"published {row['published gain %']:+.0f}%", fontsize=9)  # fmt: skip
        ax.set_xlabel("change in gain over MTP-1 (pp)")
        ax.grid(True, axis="x", alpha=0.3)
    first = np.atleast_1d(axes)[0]
    first.set_yticks(y)
    # wrapped, so the longest assumption (prefill share) is not clipped at the left edge
    first.set_yticklabels([textwrap.fill(o, 34, break_on_hyphens=False) for o in order], fontsize=7)
    handles, labels = first.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncols=3, fontsize=8, frameon=False)
    fig.suptitle("paper-check sensitivity: one assumption at a time, each variant refitted on "
                 "V4-Flash before it predicts V4-Pro (arrows: a policy cannot serve the SLA)",
                 fontsize=10)  # fmt: skip
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    return fig


def _needed_fixed_ms(probe: pd.DataFrame, col: str, target: float) -> float:
    """The fixed cost per step at which the probe's gain reaches ``target`` (log-interpolated
    between the two probe rows around it); NaN when no two rows bracket it."""
    if probe.empty:
        return float("nan")
    xs = probe["Pro fixed overhead ms"].to_numpy()
    ys = probe[col].to_numpy()
    for x0, x1, y0, y1 in zip(xs[:-1], xs[1:], ys[:-1], ys[1:], strict=True):
        if np.isfinite(y0) and np.isfinite(y1) and min(y0, y1) <= target <= max(y0, y1):
            l0, l1, lt = (math.log1p(y / 100) for y in (y0, y1, target))
            return float(x0 + (x1 - x0) * (lt - l0) / (l1 - l0)) if l1 != l0 else float(x0)
    return float("nan")


def _at_50(models: dict[str, pd.DataFrame]) -> str:
    """How each transfer rule's Pro gain at the higher SLA point sits against the published one:
    short of it, or past it (MTP-1 unable to serve: the gain is unbounded)."""
    short, past = [], []
    for name, rows in models.items():
        r = rows.iloc[-1]
        g, pub = r["simulated gain %"], r["published gain %"]
        if math.isfinite(g):
            (short if g < pub else past).append(f"{name} ({g:+.0f}%)")
        elif r.get("reach") == "MTP-1 cannot serve":
            past.append(f"{name} (MTP-1 cannot serve: unbounded)")
    sla = models[next(iter(models))].iloc[-1]["SLA tok/s/user"]
    parts = [f"{k}: {', '.join(v)}" for k, v in (("short of the published gain", short),
                                                 ("past it", past)) if v]  # fmt: skip
    return f"At {sla:g} tok/s/user, " + "; ".join(parts) + "." if parts else ""


def _gains(rows: pd.DataFrame) -> str:
    """'+21% at 35, +57% at 50'; a point a policy cannot serve says which (not a number)."""

    def one(r: pd.Series) -> str:
        g = r["simulated gain %"]
        if math.isfinite(g):
            return f"{g:+.0f}% at {r['SLA tok/s/user']:g}"
        return f"{r.get('reach', 'out of reach')} at {r['SLA tok/s/user']:g}"

    return ", ".join(one(r) for _, r in rows.iterrows())


def _moves(p_from: pd.DataFrame, p_to: pd.DataFrame) -> str:
    """'a -> b at SLA against pub (gap x -> y points)' for each SLA point."""
    out = []
    for (_, r0), (_, r) in zip(p_from.iterrows(), p_to.iterrows(), strict=True):
        g0, g, pub = r0["simulated gain %"], r["simulated gain %"], r["published gain %"]
        out.append(f"{g0:+.0f}% -> {g:+.0f}% at {r['SLA tok/s/user']:g} against {pub:+.0f}% "
                   f"(gap {abs(pub - g0):.0f} -> {abs(pub - g):.0f} points)")  # fmt: skip
    return "; ".join(out)


def _verdict(p_from: pd.DataFrame, p_to: pd.DataFrame) -> str:
    """Whether a mechanism narrows, closes or overshoots the gap at each SLA point (within 5
    points counts as closed)."""
    out = []
    for (_, r0), (_, r) in zip(p_from.iterrows(), p_to.iterrows(), strict=True):
        g0, g, pub = r0["simulated gain %"], r["simulated gain %"], r["published gain %"]
        at = f"at {r['SLA tok/s/user']:g}"
        if not (math.isfinite(g) and math.isfinite(g0)):
            out.append(f"{at}: SLA out of reach")
        elif abs(g - pub) <= 5:
            out.append(f"{at}: closes the gap")
        elif (g - pub) * (g0 - pub) < 0:
            out.append(f"{at}: overshoots by {g - pub:.0f} points")
        elif abs(g - pub) < abs(g0 - pub) - 1:
            out.append(f"{at}: narrows the gap by {abs(g0 - pub) - abs(g - pub):.0f} points, "
                       f"{abs(g - pub):.0f} left")  # fmt: skip
        else:
            out.append(f"{at}: does not narrow the gap")

    text = "; ".join(out)
    return text[:1].upper() + text[1:] + "."


def _discussion(v: dict[str, Any], pvp: pd.DataFrame) -> list[str]:
    lines = ["## Reading it", ""]
    from specsim.sim.deployments import FLASH_DEPLOYMENT, PRO_DEPLOYMENT, all_to_all

    f = pvp[pvp["model"] == "V4-Flash"]
    p = pvp[pvp["role"] == PRED]
    pnf = pvp[pvp["role"] == NO_FLOOR]
    p0 = pvp[pvp["role"] == FIRST]
    fa, pa = all_to_all(FLASH_DEPLOYMENT), all_to_all(PRO_DEPLOYMENT)
    plh = pvp[pvp["role"] == PRED_LH]
    pc = pvp[pvp["role"] == PRED_CONST]

    def ratios(rows: pd.DataFrame) -> str:
        pairs = zip(rows["simulated gain %"], rows["published gain %"], strict=True)
        return " / ".join(f"{(1 + g / 100) / (1 + q / 100):.2f}" for g, q in pairs)

    lines.append(
        f"- **The result is the first out-of-sample prediction** (commit `{FIRST_COMMIT}`, "
        "30 Nov 2026): +16% at 35, +35% at 50 against the published +52% / +406% ((1 + sim) / "
        "(1 + pub) = 0.76 / 0.27): it missed both points. Everything added after it (the "
        "derived all-to-all, the cross-node floor) was added because it missed and is post "
        "hoc. The same first model re-run on today's code, whose default is serving model v2 "
        f"(chunked prefill, paged KV, drafting charged by what is drafted; `fd4a549`): "
        f"{_gains(p0)}. The pre-registered run (the third model, frozen before this run with "
        f"its alternatives, also on serving model v2): {_gains(p)} (on serving model v1, "
        "`ff8289c`, the same model gave +19% / +58%); Pro's fixed cost carried x layers x "
        f"hidden instead: {_gains(plh)}; not carried at all: {_gains(pc)}. "
        + _at_50({"the pre-registered rule": p, "x layers x hidden": plh, "fixed = Flash's": pc})
    )
    lines.append(f"- Fit (V4-Flash): simulated {_gains(f)} against published +51% / +661%.")
    lines.append(
        f"- Prediction (V4-Pro, fit untouched, derived all-to-all with its cross-node floor): "
        f"simulated {_gains(p)} against published +52% / +406%; without the floor {_gains(pnf)}."
    )
    lines.append(
        "- The fit is two numbers with two free parameters, so a good Flash fit is expected, "
        "not evidence. Its shape is informative: the +661% at 120 tok/s/user is a knife edge "
        "(MTP-1 only just reaches 120 tok/s/user at one request; a few tenths of a ms of fixed "
        "overhead move it by hundreds of points or put it out of reach, see `fit_grid.csv`), "
        "while the +51% at 80 needs a large per-token cost, i.e. a step that grows steeply "
        f"with verified tokens (step at B = 640: {v['best']['step_ms_b640']:.0f} ms with the "
        "fit, against 41 ms with 20 us per token; the paper's round at batch 128, verification "
        "+ draft + sampling, is 188-190 ms, so a steep step does not contradict that "
        "microbenchmark)."
    )
    sens = v["sens"]

    def variant(label: str) -> str:
        if sens.empty:
            return ""
        pro = sens[sens["deployment"] == "v4-pro"]
        hit = pro[pro["high"] == label]
        col = "gain_high"
        if hit.empty:
            hit, col = pro[pro["low"] == label], "gain_low"
        return ", ".join(
            (f"{g:+.0f}% at {t:g}" if math.isfinite(g) else f"n/a at {t:g} (SLA out of reach)")
            for g, t in zip(hit[col], hit["sla_tps"], strict=True)
        )

    lines.append(
        "- The cross-node all-to-all's bandwidth, modelled: V4-Pro does not fit one 8-GPU node "
        "(865 GB > 8 x 96 GB), so half of every token's expert copies cross the NICs. Derived "
        "from the fabric (bytes x top-k x layers x share / (GPUs x bandwidth)), it costs "
        f"{pa.nic_us:.2f} us per padded token over the NICs plus {pa.nvlink_us:.2f} us over "
        f"NVLink on Pro, {fa.total_us:.2f} us on single-node Flash, against the "
        f"{v['pro_fit'].per_token_us:.0f} us per token Pro carries from the fit. Without any "
        f"all-to-all -> with its bandwidth term: {_moves(p0, pnf)}. It closes none of the gap: "
        "a per-token cost weighs more on DSpark (about 4-7 tokens verified per request per step "
        "for 3.3 emitted) than on MTP-1 (2 verified, 1.9 emitted), so charging it lowers the "
        "gain; and it is small: even a tenth of the bandwidth (the tornado's `a2a-x10`) gives "
        f"{variant('a2a-x10')}, against {_gains(p)} at full bandwidth. Bandwidth is not what "
        "Pro is missing."
    )
    probe = v["probe"]
    pubs = p["published gain %"].to_numpy()
    need35 = _needed_fixed_ms(probe, "gain % @35", float(pubs[0]))
    need50 = _needed_fixed_ms(probe, "gain % @50", float(pubs[-1]))
    have = v["pro_fit"].overhead_ms + pa.floor_ms
    lines.append(
        "- The cross-node latency floor, modelled: a fixed cost per step, the kind of cost "
        "the gap at 50 tok/s/user calls for (a per-token cost cannot slow a step at one "
        "request). From DeepEP's published low-latency table (EP 16 = Pro's 2 nodes of 8; "
        "latency at 128 tokens per GPU minus those tokens' cross-node bytes at the NIC "
        f"bandwidth) it is {pa.floor_us_per_layer:.0f} us per MoE layer, "
        f"{pa.floor_ms:.1f} ms a step over {pa.layers} layers. Without it -> with it: "
        f"{_moves(pnf, p)}. {_verdict(pnf, p)} Its generous reading, "
        f"the whole published EP 16 latency as a floor ({v['raw_floor_us']:.0f} us per layer, "
        f"{v['raw_floor_us'] * pa.layers / 1000:.0f} ms a step; it counts the transfer of 128 "
        f"tokens per GPU that the SLA points do not carry), gives {variant('floor-raw')} "
        "(the tornado's `floor-raw`). This mechanism is post hoc (added because the first "
        "prediction missed a fixed cost) and rests on a reading of a pure-RDMA table (see the "
        "correction above): the `floor-0` row, no floor beyond the transfer, is as defensible."
    )

    def ms(x: float) -> str:
        return f"about {x:.0f} ms" if math.isfinite(x) else "outside the probe's range"

    lines.append(
        "- What remains: Pro's step at one request comes out at "
        f"{v['pro']['step_ms_b1']:.1f} ms (fixed {have:.1f} ms: {v['pro_fit'].overhead_ms:.1f} "
        f"carried + {pa.floor_ms:.1f} floor). The probe above puts the whole fixed cost per "
        f"step Pro would need at {ms(need35)} for +52% at 35 tok/s/user and {ms(need50)} for "
        "+406% at 50"
        + (
            f": ~{need50 - have:.0f} ms per step is still missing, a fixed cost and not a "
            "bandwidth, and the sourced facts leave nothing of that size"
            if math.isfinite(need50)
            else ""
        )
        + (
            f" (as a floor: {1000 * (need35 - v['pro_fit'].overhead_ms) / pa.layers:.0f}-"
            f"{1000 * (need50 - v['pro_fit'].overhead_ms) / pa.layers:.0f} us per MoE layer "
            f"beyond the carried overhead, between the {pa.floor_us_per_layer:.0f} us derived "
            f"and the {v['raw_floor_us']:.0f} us of the whole published EP 16 latency)"
            if math.isfinite(need35) and math.isfinite(need50)
            else ""
        )
        + ". Not settled by public facts, and so not modelled: the GPU (the paper says only "
        "'production GPUs'; H20-class is assumed) and how Pro is deployed. One candidate with a "
        "public anchor: this model gives Pro the fewest nodes that hold its weights (2), "
        "while DeepSeek's published V3/R1 decode unit spans 18 nodes (EP 144, prefill "
        "disaggregated; open-infra-index, 'DeepSeek-V3/R1 Inference System Overview'), where "
        "DeepEP's table gives 192-194 us dispatch and 360-369 us combine (EP 128-256). "
        "Modelling that would make Flash multi-node too and so change the calibration; the "
        "V4 deployments are not published."
    )
    if "rank" in v:
        lines.append("- The three assumptions that move the gains most: "
                     + "; ".join(v["rank"].index[:3]) + ".")  # fmt: skip
    return lines
