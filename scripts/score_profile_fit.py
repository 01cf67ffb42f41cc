"""Score ``specsim profile fit`` by leave-points-out on the published source that has a
no-speculation arm (issue 64, item 3): vLLM's adaptive-verification fig. 3 (V4-Pro-0813, TP 8
on 8 B300s, closed loops at 1-256 in flight; reports/real-deployments/config.toml).

    python scripts/score_profile_fit.py

The rule, committed before the run: the deployment built as the calibration script builds it
(capture 4096, 256 sequences, 16,384 batched tokens, fig. 2's drafter); fitted on the ``none``
arm at 1 and 64 in flight only (TPOT = 1000 / the published tok/s per user; prompt and output
tokens: the means of the config's pre-registered workload); then every arm replayed at every
concurrency on the fitted profile, as the calibration script replays the built one. Scored:
the no-speculation throughput at the four concurrencies not fitted (goal: within 10%), and
every speculative arm's gain over ``none`` at every concurrency, (1 + predicted) / (1 +
published) (goal: in [0.85, 1.15] on at least 90%). The DSpark paper's table (source B) has no
no-speculation arm, so it cannot be fitted on.
"""

from __future__ import annotations

import sys
import time
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
FIT_C = (1, 64)


def main(argv: list[str] | None = None) -> int:
    from specsim.errors import LineParser, run_script

    ap = LineParser(prog="score_profile_fit.py", description=__doc__.split("\n\n")[0])
    ap.parse_args(argv)
    return run_script(ap.prog, _run)


def _run() -> int:
    import calibrate_profile_build as cal

    from specsim.analysis.reports.real_deployments import ARMS, _run_arm
    from specsim.sim.cost.baseline import BaselinePoint
    from specsim.sim.cost.build import Deployment
    from specsim.sim.cost.build_profile import build
    from specsim.sim.cost.fit import fit, fitted_profile
    from specsim.sim.cost.models import model_arch
    from specsim.trace.synth import PROFILES as ACCEPT

    t0 = time.perf_counter()
    cfg = tomllib.loads(cal.CONFIG.read_text())
    pub = pd.read_csv(cal.FIG / "fig3_pareto.csv")
    dep = Deployment(model_arch("deepseek-v4-pro"), gpu="B300", tp=8, engine="vllm",
                     drafter=cal.FIG2_DRAFTER, capture=cfg["vllm_dst_capture"],
                     max_running=cfg["vllm_max_running"],
                     max_batched_tokens=cfg["vllm_max_batched_tokens"])  # fmt: skip
    built = build(dep)[0]
    wl = cal._workload(cfg, "vllm")
    trace = wl.trace(ACCEPT[cfg["vllm_accept_profile"]], cfg["vllm_auroc"])
    prompt, output = float(np.mean(trace.prompt_len)), float(np.mean(trace.output_len))
    none = pub[pub["arm"] == "none"].set_index("concurrency")
    points = [BaselinePoint(c, prompt, output, float(none.loc[c, "throughput_tok_s"]),
                            1000.0 / float(none.loc[c, "interactivity_tok_s_user"]), None,
                            f"fig. 3 none c={c}") for c in FIT_C]  # fmt: skip
    result = fit(built, points)
    model = fitted_profile(built, result)
    print(f"fit on fig. 3 none at c = {FIT_C}: GPU x{result.scale:.3f}, step "
          f"{result.step_ms:.3f} ms, per request {result.per_request_ms * 1000:.1f} us; "
          f"{result.residual_text()} (workload means: {prompt:.0f} in / {output:.0f} "
          "out)")  # fmt: skip
    rows = []
    arms = ["none", *(a for a in cfg["vllm_arms"] if a != "none")]
    for arm in arms:
        for r in _run_arm(trace, ARMS[arm], model, cfg["vllm_concurrency"], cfg["min_requests"],
                          wl.seed):  # fmt: skip
            rows.append({"arm": arm, **r})
    pred = pd.DataFrame(rows).set_index(["arm", "concurrency"])["throughput_tok_s"]
    pb = pub.set_index(["arm", "concurrency"])["throughput_tok_s"]
    out = []
    for arm, c in pred.index:
        if (arm, c) not in pb.index:
            continue
        if arm == "none":
            kind = "level (fitted)" if c in FIT_C else "level (held out)"
            out.append({"point": f"none c={c}", "kind": kind, "published": pb[(arm, c)],
                        "predicted": pred[(arm, c)],
                        "ratio": pred[(arm, c)] / pb[(arm, c)]})  # fmt: skip
            continue
        g_pub, g_pred = pb[(arm, c)] / pb[("none", c)], pred[(arm, c)] / pred[("none", c)]
        out.append({"point": f"{arm} c={c}", "kind": "gain", "published": g_pub - 1,
                    "predicted": g_pred - 1, "ratio": g_pred / g_pub})  # fmt: skip
    df = pd.DataFrame(out)
    held = df[df["kind"] == "level (held out)"]
    gains = df[df["kind"] == "gain"]
    lvl_ok = int((np.abs(held["ratio"] - 1) <= 0.10).sum())
    g_ok = int(((gains["ratio"] >= 0.85) & (gains["ratio"] <= 1.15)).sum())
    sign = int(((gains["predicted"] > 0) == (gains["published"] > 0)).sum())
    print(f"held-out no-spec level within 10%: {lvl_ok}/{len(held)} (ratios "
          f"{held['ratio'].min():.2f}-{held['ratio'].max():.2f})")  # fmt: skip
    print(f"gain ratio in [0.85, 1.15]: {g_ok}/{len(gains)} (ratios {gains['ratio'].min():.2f}-"
          f"{gains['ratio'].max():.2f}, median {gains['ratio'].median():.2f}); sign right "
          f"{sign}/{len(gains)}")  # fmt: skip
    with pd.option_context("display.width", 160):
        print(df.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print(f"total {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
