"""The machine's speed as a grid runs: a fixed probe between its rounds, and each run's speed
against the calibration's (``--drift-probe``).

Why: a grid's calibration and its runs are minutes to an hour apart, and a shared 2-core VM's
speed at one load moved by up to 1.7x between grids and by half within one
(reports/llama-cpp-v4/held-out-7/NOTES.md). A profile calibrated in a fast phase then prices
runs made in a slow one, and the step model's error cannot be told from the machine's. The
probe is the same small job every time (the plain server, one request at a time, greedy, on
the calibration prompts, the same draw of jobs), run once before the first round (right after
the calibrations, where they run before the grid) and after every round; a run's speed is the
mean of the probes either side of its round over the first probe. The grid is scored as
measured (``fidelity.csv``: what a user of the profile gets) and, beside it, with each run
simulated on the profile's times scaled by its speed (``fidelity-drift.csv``): what the step
model misses with the machine's drift taken out. The probe's mean TPOT is its clock: a
decode's time, which prompt caching between probes of the same prompts does not shorten
(their time to first token it does).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from specsim.errors import RunFailed, SpecsimError
from specsim.fidelity.llama.config import LlamaValidationConfig

START = -1  # the probe's round label before the grid's first round (right after calibration)


def probe(
    cfg: LlamaValidationConfig,
    srv,  # noqa: ANN001 - the plain setting's started LlamaServer
    ids: list[list[int]],
    lengths: list[int],
    after_round: int,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """One probe on ``srv``: ``cfg.drift_probe`` requests at C = 1, T = 0 of the calibration
    prompts (``ids``, ``lengths``), drawn from one fixed seed, so every probe sends the same
    jobs. The first probe is the grid server's first work, and a server's first request after
    loading runs up to five times slower (reports/llama-cpp-v4/PLAN.md step 2c): one short
    request warms it first, unmeasured, as the calibration's first does (held-out-8's first
    probe was taken cold, before this). A failed request fails the grid (a probe of the
    survivors is not the same job)."""
    from specsim.fidelity.llama.servers import send

    load_1m = os.getloadavg()[0]
    if after_round == START:  # a server's first request runs slow: warm it, unmeasured
        send(srv, ids[:1], [min(lengths[0], 16)], temperature=0.0, seed=cfg.seed, concurrency=1)
    jobs, res, summary = send(srv, ids, lengths, temperature=0.0, seed=cfg.seed + 1,
                              concurrency=1, requests=cfg.drift_probe)  # fmt: skip
    failed = [r.error for r in res if r.error]
    if failed:
        raise RunFailed(
            f"{len(failed)} of {len(res)} drift-probe requests failed (after round "
            f"{after_round}); first error: {failed[0]}"
        )
    row = {"after_round": after_round, "requests": len(res), "unix_s": time.time(),
           "tpot_ms_mean": float(summary["tpot_ms_mean"]),
           "throughput_tok_s": float(summary["throughput_tok_s"]), "load_1m": load_1m}  # fmt: skip
    where = "before round 0" if after_round == START else f"after round {after_round}"
    log(f"  drift probe {where}: TPOT {row['tpot_ms_mean']:.2f} ms (load {load_1m:.2f})")
    return row


def round_speeds(probes: pd.DataFrame) -> dict[int, float]:
    """Round -> the machine's speed in it against the calibration's: the mean probe TPOT
    before and after the round over the first probe's (``after_round`` = -1). A round with
    one neighbouring probe (a grid stopped early) takes that one."""
    if probes.empty or START not in set(probes["after_round"]):
        raise SpecsimError("probes.csv has no probe before the first round (after_round -1)")
    tpot = probes.groupby("after_round")["tpot_ms_mean"].mean()
    if not (np.isfinite(tpot.to_numpy()).all() and (tpot > 0).all()):
        raise SpecsimError("probes.csv holds a probe without a positive mean TPOT")
    ref = float(tpot[START])
    out: dict[int, float] = {}
    for r in range(0, int(tpot.index.max()) + 2):
        sides = [float(tpot[k]) for k in (r - 1, r) if k in tpot.index]
        if sides:
            out[r] = float(np.mean(sides)) / ref
    return out


def run_speeds(runs: pd.DataFrame, probes: pd.DataFrame) -> pd.Series:
    """Each run's speed factor (indexed as ``runs``), from its ``round``."""
    if "round" not in runs.columns:
        raise SpecsimError("runs.csv has no 'round' column: only a --target-ci grid is probed")
    speeds = round_speeds(probes)
    missing = sorted(set(runs["round"].astype(int)) - set(speeds))
    if missing:
        raise SpecsimError(f"round {missing[0]} of runs.csv has no drift probe either side of it")
    return runs["round"].astype(int).map(speeds).astype(np.float64)


def section(probes: pd.DataFrame, g: dict[str, float]) -> str:
    """The README's section on the drift: the probes and the goals scored at each run's own
    speed (``g``: :func:`specsim.fidelity.llama.report.goals` of ``fidelity-drift.csv``)."""
    speeds = round_speeds(probes)
    rows = "\n".join(
        f"| {'start' if int(r.after_round) == START else int(r.after_round)} | "
        f"{r.tpot_ms_mean:.2f} | {r.load_1m:.2f} |"
        for r in probes.itertuples()
    )
    span = f"{min(speeds.values()):.2f}-{max(speeds.values()):.2f}" if speeds else "n/a"
    gain = ""
    if "gain_signs_wrong" in g:
        wrong, judged = g["gain_signs_wrong"], g["gain_signs_judged"]
        gain = f"; gains' signs wrong in {wrong:.0f} of {judged:.0f}"
    thr, thr_max = 100 * g["throughput_median_abs"], 100 * g["throughput_max_abs"]
    return (
        "\n## The machine's drift (probes.csv, fidelity-drift.csv)\n\n"
        "The same probe (the plain server, C = 1, greedy, the calibration prompts) before the "
        "first round (after the calibration, where it runs before the grid) and after every "
        "round; a round's speed is the mean of the probes either side of it over the first: "
        f"**{span}** here.\n\n"
        "| after round | probe mean TPOT (ms) | 1-min load |\n|---|---|---|\n"
        f"{rows}\n\n"
        "Scored with each run simulated at its round's speed (the profile's times scaled; "
        "the headline above is as measured): throughput median |error| "
        f"**{thr:.1f}%** (worst {thr_max:.1f}%), "
        f"mean TPOT **{100 * g['tpot_mean_median_abs']:.1f}%** "
        f"(worst {100 * g['tpot_mean_max_abs']:.1f}%){gain}.\n"
    )
