"""``specsim report real-deployments``: predict published DSpark deployments from their inputs.

Calibration uses published measurements of step cost only (vLLM's startup profile of V4-Flash on
4 B300s, fig. 2 of its adaptive-verification post); every outcome is predicted, none is fitted:

- ``vllm``: the post's benchmark (V4-Pro on 8 B300s, closed loops at each concurrency): the
  measured Flash table carried to Pro by :mod:`specsim.sim.cost.transfer` (primary rules, and
  the low / high tables over every rule combination), each arm replayed: ``adaptive`` =
  ``vllm-adaptive``, ``k1..k7`` = ``static:k``, ``none`` = ``ar``.
- ``paper``: the DSpark paper's production table (DSpark-5 against MTP-1 at two per-user SLAs
  per model): the same table carried to V4-Flash and V4-Pro on the configured production GPUs
  (a cross-node expert all-to-all added where a deployment spans nodes, from
  :func:`specsim.sim.cost.all_to_all.all_to_all`), MTP-1 = ``static:1`` with a one-layer MTP
  drafter, DSpark = ``zos`` with the transferred DSpark drafter; throughput per GPU at each SLA
  read off each arm's frontier.

Every input is in the folder's ``config.toml``; ``PREREGISTRATION.md`` fixes them and the
scoring rule before the run. The builder writes ``predictions.csv`` (the issue's columns plus
the low / high range) and ``paper_gains.csv``; scoring against published numbers is a separate
step (``scorecard.csv``), made after the run from numbers read off the sources.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from specsim.analysis.report import ReportContext
from specsim.errors import SpecsimError
from specsim.sim.cost.accelerators import ACCELERATORS

ARMS = {"adaptive": "vllm-adaptive", "k1": "static:1", "k3": "static:3", "k5": "static:5",
        "k6": "static:6", "k7": "static:7", "none": "ar"}  # fmt: skip
RANGE = ("low", "primary", "high")
MODELS = ("v4-flash", "v4-pro")
# a lognormal length's median and spread: a request is clipped to [median / 16, median x 16]
# (prompts) or [median / 8, median x 4] (outputs), so the median stays inside what one request
# may hold; a sigma past 4 puts nearly every request at a clip
MAX_MEDIAN_TOKENS = 131_072
MAX_SIGMA = 4.0


@dataclass(frozen=True)
class Workload:
    """The synthetic requests a source is replayed with (lengths in tokens)."""

    prompt_median: float
    prompt_sigma: float
    output_median: float
    output_sigma: float
    trace_requests: int
    seed: int

    def trace(self, accept: tuple[float, ...], auroc: float):  # type: ignore[no-untyped-def]
        from specsim.trace.synth import LogNormal, synth_trace

        lo_p, hi_p = max(1, int(self.prompt_median / 16)), int(self.prompt_median * 16)
        lo_o, hi_o = max(4, int(self.output_median / 8)), int(self.output_median * 4)
        return synth_trace(
            n_requests=self.trace_requests,
            accept_profile=list(accept),
            prompt_len=LogNormal(self.prompt_median, self.prompt_sigma, lo_p, hi_p),
            output_len=LogNormal(self.output_median, self.output_sigma, lo_o, hi_o),
            auroc=auroc,
            seed=self.seed,
        )


def _layout(model: str, gpu: str, gpus: int, capture: int):  # type: ignore[no-untyped-def]
    from specsim.sim.cost.accelerators import accelerator
    from specsim.sim.cost.deployments import V4_FLASH, V4_PRO
    from specsim.sim.cost.transfer import Layout

    models = {"v4-flash": V4_FLASH, "v4-pro": V4_PRO}
    if model not in models:
        raise SpecsimError(f"unknown model {model!r} in config.toml; use v4-flash or v4-pro")
    return Layout(models[model], accelerator(gpu), int(gpus), capture_max_tokens=int(capture))


def _side(ctx: ReportContext, side: str):  # type: ignore[no-untyped-def]
    """The vLLM source's measured (``src``) or benchmarked (``dst``) layout, from the config."""
    return _layout(
        ctx.choice(f"vllm_{side}_model", MODELS),
        ctx.choice(f"vllm_{side}_gpu", ACCELERATORS),
        ctx.count(f"vllm_{side}_gpus"),
        ctx.count(f"vllm_{side}_capture"),
    )


def _cross_node(model: str, gpu: str, gpus: int) -> tuple[float, float]:
    """(per padded token us, fixed ms) of the expert all-to-all a deployment spanning nodes adds
    on top of a one-node measurement: its NIC share and its cross-node latency floor."""
    from specsim.sim.cost.accelerators import accelerator
    from specsim.sim.cost.all_to_all import all_to_all
    from specsim.sim.cost.deployments import DEPLOYMENTS

    dep = DEPLOYMENTS[model]
    acc = accelerator(gpu)
    node = float(acc.per_node)
    if gpus <= node:
        return 0.0, 0.0
    dep = replace(dep, gpu=acc.gpu_facts())  # its GPU count: whole nodes holding the weights
    a = all_to_all(dep)
    return a.nic_us, a.floor_ms


def carried_profiles(measured: str, src: Any, dst: Any, extra_us: float = 0.0,
                     extra_ms: float = 0.0, **limits: Any) -> dict[str, Any]:  # fmt: skip
    """The low / primary / high profiles of ``dst`` carried from the ``measured`` profile."""
    from specsim.sim.cost.profiles import get_profile
    from specsim.sim.cost.transfer import transfer_range

    tables = transfer_range(get_profile(measured), src, dst)
    out = {}
    for tag, t in zip(RANGE, tables, strict=True):
        ms = np.asarray(t.step_ms) + extra_ms + extra_us * t.batch_tokens / 1000.0
        out[tag] = replace(t, name=f"{t.name.split(':')[0]}:{tag}", step_ms=ms, **limits)
    return out


def _run_arm(trace, policy: str, profile, conc: list[int], min_req: int, seed: int):  # type: ignore[no-untyped-def]
    from specsim.sim.simulate import replay

    rows = []
    for c in conc:
        n = max(min_req, 3 * c + 32)
        s = replay(trace, policy, concurrency=c, requests=n, profile=profile, seed=seed,
                   record_tokens=False).summary  # fmt: skip
        steady = s.get("steady_throughput_tok_s", float("nan"))
        thr = steady if math.isfinite(steady) else s["throughput_tok_s"]
        tpot = s["tpot_ms_p50"]
        rows.append({
            "concurrency": c, "requests": n, "throughput_tok_s": thr,
            "throughput_per_gpu_tok_s": thr / profile.gpus,
            "interactivity_tok_s_user": 1000.0 / tpot if tpot > 0 else float("nan"),
            "per_user_tps_mean": s["per_user_tps_mean"], "tau": s["tau"],
            "verified_draft_tokens": s["verified_draft_tokens"],
        })  # fmt: skip
    return rows


def predict_vllm(ctx: ReportContext) -> pd.DataFrame:
    """Every arm of vLLM's benchmark at every concurrency, on the low / primary / high tables."""
    from specsim.trace.synth import PROFILES as ACCEPT

    src, dst = _side(ctx, "src"), _side(ctx, "dst")
    limits = {"max_running": ctx.count("vllm_max_running"),
              "max_batched_tokens": ctx.count("vllm_max_batched_tokens"),
              "kv_tokens": ctx.count("vllm_kv_tokens")}  # fmt: skip
    profiles = carried_profiles(ctx.get("vllm_measured_profile", kind=str), src, dst, **limits)
    wl = _workload(ctx, "vllm")
    trace = wl.trace(ACCEPT[ctx.choice("vllm_accept_profile", ACCEPT)], _auroc(ctx, "vllm"))
    conc = ctx.counts("vllm_concurrency")
    arms = ctx.choices("vllm_arms", ARMS)
    rows = []
    for tag, prof in profiles.items():
        for arm in arms:
            for r in _run_arm(trace, ARMS[arm], prof, conc, ctx.count("min_requests"),
                              wl.seed):  # fmt: skip
                rows.append({"source": "vllm-adaptive-verification", "model": dst.model.name,
                             "deployment": f"{dst.gpus}x{dst.gpu.name}", "arm": arm,
                             "table": tag, **r})  # fmt: skip
    return pd.DataFrame(rows)


def _auroc(ctx: ReportContext, prefix: str) -> float:
    """A confidence AUROC: 0.5 (no signal) to 1 (perfect ranking)."""
    value = ctx.positive(f"{prefix}_auroc")
    if not 0.5 <= value <= 1.0:
        raise SpecsimError(f"config.toml: '{prefix}_auroc' is {value}; give a value in [0.5, 1]")
    return value


def _workload(ctx: ReportContext, prefix: str) -> Workload:
    return Workload(
        prompt_median=ctx.positive(f"{prefix}_prompt_median", most=MAX_MEDIAN_TOKENS, least=1),
        prompt_sigma=ctx.positive(f"{prefix}_prompt_sigma", most=MAX_SIGMA),
        output_median=ctx.positive(f"{prefix}_output_median", most=MAX_MEDIAN_TOKENS, least=1),
        output_sigma=ctx.positive(f"{prefix}_output_sigma", most=MAX_SIGMA),
        trace_requests=ctx.count("trace_requests"),
        seed=ctx.count("seed", least=0),
    )


def predict_paper(ctx: ReportContext) -> tuple[pd.DataFrame, pd.DataFrame]:
    """DSpark-5 (``zos``) against MTP-1 (``static:1``) on V4-Flash and V4-Pro: the curves and
    the throughput gains per GPU at each SLA point, on the low / primary / high tables."""
    from specsim.analysis.frontier import throughput_at
    from specsim.sim.cost.deployments import DEPLOYMENTS
    from specsim.trace.synth import PROFILES as ACCEPT

    src = _side(ctx, "src")
    wl = _workload(ctx, "paper")
    profile = ACCEPT[ctx.choice("paper_accept_profile", ACCEPT)]
    block = ctx.count("paper_dspark_block", most=len(profile))  # the profile's depths at most
    dspark = wl.trace(profile[:block], _auroc(ctx, "paper"))
    mtp1 = ctx.positive("paper_mtp1_acceptance")
    if not mtp1 < 1:
        raise SpecsimError(f"config.toml: 'paper_mtp1_acceptance' is {mtp1}; give a rate in (0, 1)")
    mtp = wl.trace((mtp1,), _auroc(ctx, "paper"))
    conc = ctx.counts("paper_concurrency")
    mtp_layers = ctx.positive("paper_mtp_layers", most=16)
    curves, gains = [], []
    for model in ("v4-flash", "v4-pro"):
        dep = DEPLOYMENTS[model]
        for gpu in ctx.choices("paper_gpus", ACCELERATORS):
            gpus = _gpus_for(model, gpu)
            dst = _layout(model, gpu, gpus, ctx.count("paper_capture"))
            extra_us, extra_ms = _cross_node(model, gpu, gpus)
            limits = {"max_running": ctx.count("paper_max_running"),
                      "max_batched_tokens": ctx.count("paper_max_batched_tokens"),
                      "kv_tokens": ctx.count("paper_kv_tokens")}  # fmt: skip
            measured = ctx.get("vllm_measured_profile", kind=str)
            profs = carried_profiles(measured, src, dst, extra_us, extra_ms, **limits)
            for tag, prof in profs.items():
                # MTP-1's drafter: one more MoE layer of the target at R tokens (plus its head)
                layer = np.asarray(prof.step_ms) / float(dst.model.layers) * mtp_layers
                r = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 512], dtype=np.int64)
                mtp_curve = tuple((int(x), float(np.interp(x, prof.batch_tokens, layer)))
                                  for x in r)  # fmt: skip
                mtp_prof = replace(prof, draft_curve=mtp_curve, name=f"{prof.name}+mtp")
                res = {}
                for arm, policy, trace, p in (("mtp1", "static:1", mtp, mtp_prof),
                                              ("dspark", "zos", dspark, prof)):  # fmt: skip
                    rows = _run_arm(trace, policy, p, conc, ctx.count("min_requests"),
                                    wl.seed)  # fmt: skip
                    for row in rows:
                        curves.append({"source": "dspark-paper", "model": dep.model.name,
                                       "deployment": f"{gpus}x{gpu}", "arm": arm, "table": tag,
                                       **row})  # fmt: skip
                    res[arm] = pd.DataFrame(rows)
                for sla, pub in zip(dep.sla_tps, dep.published_gain_pct, strict=True):
                    t = {a: throughput_at(d["per_user_tps_mean"].to_numpy(),
                                          d["throughput_per_gpu_tok_s"].to_numpy(), sla)
                         for a, d in res.items()}  # fmt: skip
                    gain = 100 * (t["dspark"] / t["mtp1"] - 1) if t["mtp1"] > 0 else float("nan")
                    gains.append({"model": dep.model.name, "gpu": gpu, "gpus": gpus,
                                  "table": tag, "sla_tok_s_user": sla,
                                  "mtp1_per_gpu_tok_s": t["mtp1"],
                                  "dspark_per_gpu_tok_s": t["dspark"], "gain_pct": gain,
                                  "published_gain_pct": pub})  # fmt: skip
    return pd.DataFrame(curves), pd.DataFrame(gains)


def _gpus_for(model: str, gpu: str) -> int:
    """Whole 8-GPU nodes holding the checkpoint in 90% of HBM (the paper check's rule)."""
    from specsim.sim.cost.accelerators import accelerator
    from specsim.sim.cost.deployments import DEPLOYMENTS

    dep = DEPLOYMENTS[model]
    return replace(dep, gpu=accelerator(gpu).gpu_facts()).gpus


def build(ctx: ReportContext) -> None:
    """Predict every configured source; write predictions.csv, paper_gains.csv, the page."""
    import time

    from specsim.outputs import write_table

    load_before = os.getloadavg()
    t0 = time.perf_counter()
    vllm = predict_vllm(ctx)
    curves, gains = predict_paper(ctx)
    wall = time.perf_counter() - t0
    allc = pd.concat([vllm, curves], ignore_index=True)
    keys = ["source", "model", "deployment", "arm", "concurrency"]
    wide = allc.pivot_table(index=keys, columns="table",
                            values=["throughput_tok_s", "interactivity_tok_s_user"])  # fmt: skip
    pred = pd.DataFrame(index=wide.index).reset_index()
    metrics = ("throughput_tok_s", "interactivity_tok_s_user")
    for metric in metrics:
        pred[metric] = wide[(metric, "primary")].to_numpy()
    for metric in metrics:  # the range: "low" is the cheapest table (the fastest outcome)
        pred[f"{metric}_low"] = wide[(metric, "low")].to_numpy()
        pred[f"{metric}_high"] = wide[(metric, "high")].to_numpy()
    for name, frame in (("predictions.csv", pred), ("paper_gains.csv", gains),
                        ("results.parquet", allc)):  # fmt: skip
        ctx.written.append(write_table(frame, ctx.folder / name))
    ctx.lines += _page(pred, gains, wall, load_before)


def _page(pred: pd.DataFrame, gains: pd.DataFrame, wall: float, load: tuple) -> list[str]:
    out = ["## Predictions (pre-registered; see PREREGISTRATION.md)", ""]
    v = pred[pred["source"] == "vllm-adaptive-verification"]
    if len(v):
        out += ["### vLLM adaptive verification: V4-Pro on 8 B300s (primary table; low-high)", "",
                "| arm | " + " | ".join(f"c={c}" for c in sorted(v["concurrency"].unique())) + " |",
                "|---|" + "---|" * v["concurrency"].nunique()]  # fmt: skip
        for arm, d in v.groupby("arm", sort=False):
            cells = [f"{r.throughput_tok_s:,.0f} tok/s, {r.interactivity_tok_s_user:.0f}/user"
                     for r in d.sort_values("concurrency").itertuples()]  # fmt: skip
            out.append(f"| {arm} | " + " | ".join(cells) + " |")
        out.append("")
    if len(gains):
        out += ["### DSpark paper production table: DSpark-5 over MTP-1 at the SLA points", "",
                "| model | GPUs | SLA tok/s/user | gain (primary) | low table | high table | "
                "published |", "|---|---|---|---|---|---|---|"]  # fmt: skip
        for (m, gpu, sla), d in gains.groupby(["model", "gpu", "sla_tok_s_user"], sort=False):
            by = d.set_index("table")["gain_pct"]
            pub = d["published_gain_pct"].iloc[0]
            out.append(f"| {m} | {d['gpus'].iloc[0]}x{gpu} | {sla:g} | {by['primary']:+.0f}% | "
                       f"{by['low']:+.0f}% | {by['high']:+.0f}% | +{pub:g}% |")  # fmt: skip
        out.append("")
    out += [
        "Scored against the published numbers in [SCORECARD.md](SCORECARD.md) (made after the "
        "run by `scripts/score_real_deployments.py`, by the rules of PREREGISTRATION.md).",
        "",
        "![Published and predicted throughput against interactivity, every vLLM arm]"
        "(vllm-pareto.png)",
        "",
        f"Run: {wall:.0f} s; 1/5/15-minute load before {load[0]:.2f} / {load[1]:.2f} / "
        f"{load[2]:.2f}.",
        "",
    ]
    return out
