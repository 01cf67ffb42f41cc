"""Score ``specsim profile fit --profile`` on a real server (issue 64, item 3): llama-server
serving SmolLM2-135M Q4_1 on this 2-core CPU, measured in the held-out grid
(reports/llama-cpp-held-out: its calibration loops and its C = 5 cells).

    python scripts/score_profile_fit_llama.py

The rule, committed before the run (the grid's measurements were published on 5 Dec 2026 and
are known; the fit below is new, and nothing of it was tried on them before this commit):

- **The operator's situation.** A profile measured elsewhere for the same model on this kind of
  CPU: the shipped ``smollm2-135m-cpu`` (``specsim profile`` on the torch engine, 29 Nov 2026,
  the DSpark drafter's torch forward as its draft terms), and their own server's runs without
  speculation: the grid's calibration loops of the plain server (``none``) at 3, 6 and 12 in
  flight, one per temperature (``calibration.csv``: mean TPOT and tok/s; prompt tokens a
  request = the prefilled tokens of the run's steps / C, output tokens = the emitted ones / C
  + 1, from ``calibration_steps.parquet``).
- **Fitted** per temperature: ``profile fit`` on the three runs (scale, step, per request).
- **Predicted**: every C = 5 cell of the grid at that temperature (none, ngram:3, ngram:7,
  dspark:7, dspark:4, dspark:7:0.5), replayed as the grid replays them (its trace per setting,
  ``ar`` for none and ``threshold:0.5`` otherwise, serving v2, KV reserved, 16 slots, 16,384
  KV tokens, a 2,048-token step budget, 15 requests, seed 0); n-gram settings on the fitted
  profile with its drafter's terms set to zero (an n-gram drafter is a table lookup, as
  ``profile build --drafter ngram`` prices it), draft-dspark on the fitted profile as it is
  (the drafter as measured on torch: not fitted, it did not run). The unfitted profile is
  replayed the same way beside it.
- **Scored** against the grid's real medians (``fidelity.csv``): throughput and mean TPOT
  errors; each speculative setting's gain over ``none`` at its temperature, (1 + predicted) /
  (1 + real), in [0.85, 1.15], and its sign. Written to
  reports/real-deployments/profile-fit-llama.csv, printed; the first run is the one reported.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
GRID = ROOT / "reports" / "llama-cpp-held-out"
OUT = ROOT / "reports" / "real-deployments" / "profile-fit-llama.csv"
BASE = "smollm2-135m-cpu"
SPECS = ("none", "ngram:3", "ngram:7", "dspark:7", "dspark:4", "dspark:7:0.5")
REPLAY = dict(concurrency=5, requests=15, seed=0, serving="v2", kv="reserve", max_running=16,
              kv_tokens=16384, max_batched_tokens=2048, record_steps=False,
              record_tokens=False)  # fmt: skip
BAND = (0.85, 1.15)


def main(argv: list[str] | None = None) -> int:
    from specsim.errors import LineParser, run_script

    ap = LineParser(prog="score_profile_fit_llama.py", description=__doc__.split("\n\n")[0])
    ap.parse_args(argv)
    return run_script(ap.prog, _run)


def baseline(temperature: float) -> list:
    """The plain server's calibration loops at ``temperature`` as the operator's runs."""
    from specsim.sim.cost.baseline import BaselinePoint

    cal = pd.read_csv(GRID / "calibration.csv")
    steps = pd.read_parquet(GRID / "calibration_steps.parquet")
    out = []
    for _, r in cal[(cal["spec"] == "none") & (cal["temperature"] == temperature)].iterrows():
        c = int(r["concurrency"])
        s = steps[(steps["spec"] == "none") & (steps["temperature"] == temperature)
                  & (steps["concurrency"] == c)]  # fmt: skip
        prompt = float(s["prefill_tokens"].sum()) / c
        output = float(s["emitted"].sum()) / c + 1.0
        out.append(
            BaselinePoint(
                c,
                prompt,
                output,
                float(r["throughput_tok_s"]),
                float(r["tpot_ms_mean"]),
                None,
                f"calibration none C={c}",
            )
        )
    return out


def predict(profile, spec: str, temperature: float) -> dict[str, float]:
    """The grid's C = 5 cell of ``spec`` replayed on ``profile``."""
    from specsim.sim.simulate import replay

    name = spec.replace(":", "-")
    trace = GRID / "traces" / f"trace-{name}-t{int(temperature)}.parquet"
    if spec.startswith("ngram"):
        profile = replace(profile, draft_base_ms=0.0, draft_per_request_ms=0.0,
                          draft_per_token_ms=0.0, draft_curve=())  # fmt: skip
    policy = "ar" if spec == "none" else "threshold:0.5"
    s = replay(str(trace), policy, profile=profile, **REPLAY).summary
    return {"throughput_tok_s": float(s["throughput_tok_s"]),
            "tpot_ms_mean": float(s["tpot_ms_mean"])}  # fmt: skip


def _run() -> int:
    import warnings

    from specsim.commands.profile_fit import fit_text
    from specsim.sim.cost.fit import fit, fitted_profile
    from specsim.sim.cost.profiles import get_profile

    t0 = time.perf_counter()
    real = pd.read_csv(GRID / "fidelity.csv")
    real = real[real["concurrency"] == 5.0]
    base = get_profile(BASE)
    rows = []
    for temp in (0.0, 1.0):
        runs = baseline(temp)
        result = fit(base, runs)
        fitted = fitted_profile(base, result)
        print(f"\n=== T = {temp:g}")
        print(fit_text(result, fitted))
        for which, prof in (("fitted", fitted), ("unfitted", base)):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                pred = {spec: predict(prof, spec, temp) for spec in SPECS}
            for spec in SPECS:
                r = real[(real["spec"] == spec) & (real["temperature"] == temp)].iloc[0]
                rt, rp = float(r["real_throughput_tok_s"]), float(r["real_tpot_ms_mean"])
                p = pred[spec]
                row = {"temperature": temp, "profile": which, "spec": spec,
                       "real_tok_s": rt, "pred_tok_s": p["throughput_tok_s"],
                       "err_tok_s": p["throughput_tok_s"] / rt - 1,
                       "real_tpot_ms": rp, "pred_tpot_ms": p["tpot_ms_mean"],
                       "err_tpot": p["tpot_ms_mean"] / rp - 1}  # fmt: skip
                if spec != "none":
                    rn = float(real[(real["spec"] == "none")
                                    & (real["temperature"] == temp)].iloc[0][
                                        "real_throughput_tok_s"])  # fmt: skip
                    g_real = rt / rn
                    g_pred = p["throughput_tok_s"] / pred["none"]["throughput_tok_s"]
                    row |= {"real_gain": g_real - 1, "pred_gain": g_pred - 1,
                            "gain_ratio": g_pred / g_real,
                            "in_band": bool(BAND[0] <= g_pred / g_real <= BAND[1]),
                            "sign_ok": bool((g_pred > 1) == (g_real > 1))}  # fmt: skip
                rows.append(row)
    df = pd.DataFrame(rows)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    tmp = OUT.with_suffix(".csv.tmp")
    df.to_csv(tmp, index=False, float_format="%.6g")
    tmp.replace(OUT)
    with pd.option_context("display.width", 200):
        print(df.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    for which, g in df.groupby("profile", sort=False):
        gains = g[g["spec"] != "none"]
        print(f"  {which}: throughput |error| median {100 * np.median(np.abs(g['err_tok_s'])):.1f}%"
              f", max {100 * np.max(np.abs(g['err_tok_s'])):.1f}%; TPOT median "
              f"{100 * np.median(np.abs(g['err_tpot'])):.1f}%, max "
              f"{100 * np.max(np.abs(g['err_tpot'])):.1f}%; gain ratio in {BAND}: "
              f"{int(gains['in_band'].sum())}/{len(gains)}; sign right "
              f"{int(gains['sign_ok'].sum())}/{len(gains)}")  # fmt: skip
    print(f"wrote {OUT.relative_to(ROOT)} ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
