"""``specsim validate --engine llama-server``: the simulator against llama.cpp's llama-server on
the wall clock, an engine specsim did not write (issue #34).

Phases (:func:`run_llama_validation`): the grid's inputs (token-id prompts in the server's chat
template, output lengths, the server's own outputs, a trace per speculative setting and
temperature: :mod:`.traces`); per setting, one server, calibration runs on other prompts at
other concurrencies (:mod:`.calibrate`) and then the grid's runs (:mod:`.grid`); the profile
fitted on the calibration steps only (:mod:`.profile`); every cell simulated and compared; the
report (:mod:`.report`). The measuring (:func:`measure`) and the scoring (:func:`score`) are
apart: ``--rescore`` scores a measured folder again without a server (a change to the simulator
or the report after seeing a grid is then said in the README).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from specsim.errors import SpecsimError
from specsim.fidelity.llama.config import LlamaValidationConfig, SpecSetting

if TYPE_CHECKING:  # pandas and the trace model load with the work, not with `specsim --help`
    import pandas as pd

    from specsim.trace.model import Trace


def run_llama_validation(
    cfg: LlamaValidationConfig, log: Callable[[str], None] = print, command: str = ""
) -> pd.DataFrame:
    """Run the grid (unless ``cfg.rescore``) and write the report folder; returns
    ``fidelity.csv``'s table. ``command``: the command line, for the README's rerun line."""
    if not cfg.rescore:
        measure(cfg, log, command)
    return score(cfg, log)


def trace_path(out: Path, name: str, t: float, draw: int = 0) -> Path:
    """Where a grid folder keeps the trace of setting ``name`` at temperature ``t`` (draw 0,
    as every grid before ``--trace-draws``; draw k beside it, ``-d<k>``)."""
    tag = f"-d{draw}" if draw else ""
    return out / "traces" / f"trace-{name.replace(':', '-')}-t{t:g}{tag}.parquet"


def measure(
    cfg: LlamaValidationConfig, log: Callable[[str], None] = print, command: str = ""
) -> None:
    """Phases 1 and 2: the grid's inputs and traces, then every setting's calibration and grid
    runs on a server of its own. Everything the scoring reads is written to ``cfg.out``."""
    import pandas as pd

    from specsim.fidelity.llama.calibrate import calibrate, calibration_server, keep_calibration_log
    from specsim.fidelity.llama.grid import real_runs
    from specsim.fidelity.llama.servers import start_server
    from specsim.fidelity.llama.traces import all_traces, prepare, trace_draws
    from specsim.outputs import write_table, write_text
    from specsim.prompts import load_many
    from specsim.trace.io import write_trace

    out = cfg.out
    (out / "logs").mkdir(parents=True, exist_ok=True)
    (out / "traces").mkdir(parents=True, exist_ok=True)
    t0, load0 = time.monotonic(), os.getloadavg()
    texts = [p.text for p in load_many(list(cfg.prompts))]
    calib = [p.text for p in load_many([cfg.calib_prompts])]
    overlap = set(texts) & set(calib)
    if overlap:
        raise SpecsimError(f"{len(overlap)} calibration prompts are also grid prompts; pick others")
    if any(s.kind == "dspark" for s in cfg.settings):  # a drafter that will not convert: now
        from specsim.fidelity.llama.servers import draft_gguf

        log(f"phase 0: the draft-dspark GGUF: {draft_gguf(cfg)}")
    log("phase 1: prompts, output lengths, the server's outputs")
    inputs = prepare(cfg, texts, calib, log)
    traces = all_traces(cfg, inputs, log)
    for (name, t), tr in traces.items():
        write_trace(tr, trace_path(out, name, t), force=True)
    for (name, t), more in trace_draws(cfg, inputs, log).items():  # --trace-draws K > 1
        for k, tr in enumerate(more, start=1):
            write_trace(tr, trace_path(out, name, t, k), force=True)
    outputs = {f"{t:g}": o for t, o in inputs.outputs.items()}
    write_text(json.dumps({"ids": inputs.ids, "lengths": inputs.lengths, "outputs": outputs}),
               out / "inputs.json")  # fmt: skip
    runs, steps, calib_rows, probes = [], [], [], []  # (phase 2 fills them)
    if cfg.target_ci is None:  # fixed --repeats: one setting's server at a time
        for s in cfg.settings:
            log(f"phase 2: {s.name}: calibration, then the grid")
            if cfg.profile is None and cfg.step_clock == "server":
                with calibration_server(cfg, s, out) as cal:
                    st, rows = calibrate(cfg, s, cal, inputs.calib_ids, inputs.calib_lengths, log)
                keep_calibration_log(s, out)
                steps.append(st)
                calib_rows += rows
            with start_server(cfg, s, out / "logs") as srv:
                if cfg.profile is None and cfg.step_clock == "client":
                    st, rows = calibrate(cfg, s, srv, inputs.calib_ids, inputs.calib_lengths, log)
                    steps.append(st)
                    calib_rows += rows
                per_t = {t: traces[(s.name, t)] for (name, t) in traces if name == s.name}
                runs += real_runs(cfg, s, srv, inputs, per_t, log)
    else:  # --target-ci: every setting's server up, the cells round-robin over all of them
        from specsim.fidelity.llama.rounds import measure_rounds

        runs, steps, calib_rows, probes = measure_rounds(cfg, inputs, traces, out, log)
    write_table(pd.DataFrame(runs), out / "runs.csv")
    if probes:
        write_table(pd.DataFrame(probes), out / "probes.csv")
    if steps:
        write_table(pd.concat(steps, ignore_index=True), out / "calibration_steps.parquet")
        write_table(pd.DataFrame(calib_rows), out / "calibration.csv")
    timing = {"minutes": (time.monotonic() - t0) / 60.0, "load_before": list(load0),
              "load_after": list(os.getloadavg()), "rescored": False,
              "command": command}  # fmt: skip
    write_text(json.dumps(timing, indent=1) + "\n", out / "grid_time.json")


def score(cfg: LlamaValidationConfig, log: Callable[[str], None] = print) -> pd.DataFrame:
    """Phase 3, from what :func:`measure` wrote: the profile fitted on the calibration steps,
    every cell simulated and compared, the report."""
    import pandas as pd

    from specsim.fidelity.llama.config import profile_file, profile_key
    from specsim.fidelity.llama.grid import compare, rankings
    from specsim.fidelity.llama.profile import (
        calibration_loads,
        calibration_steps,
        cost_model,
        fit_kinds,
    )
    from specsim.fidelity.llama.report import write_report
    from specsim.fidelity.llama.servers import limits
    from specsim.outputs import jsonable, write_table, write_text
    from specsim.sim.cost.profiles import read_profile_csv, write_profile_csv
    from specsim.trace.io import read_trace

    out = cfg.out
    need = [out / "runs.csv", out / "grid_time.json"]
    need += [trace_path(out, s.name, t, k) for s in cfg.settings for t in cfg.temperatures
             for k in range(cfg.trace_draws)]  # fmt: skip
    if cfg.profile is None:
        need.append(out / "calibration_steps.parquet")
    if cfg.drift_probe:
        need.append(out / "probes.csv")
    missing = [str(p) for p in need if not p.exists()]
    if missing:
        raise SpecsimError(f"nothing measured to score in {out}: {missing[0]} is missing")
    log("phase 3: profile, simulation, comparison")
    runs_df = pd.read_csv(out / "runs.csv")
    traces: dict[tuple[str, float], Trace] = {
        (s.name, float(t)): read_trace(trace_path(out, s.name, t))
        for s in cfg.settings for t in cfg.temperatures
    }  # fmt: skip
    draws: dict = traces  # --trace-draws K > 1: every draw of each setting's trace, in order
    if cfg.trace_draws > 1:
        draws = {key: (tr, *(read_trace(trace_path(out, key[0], key[1], k))
                             for k in range(1, cfg.trace_draws)))
                 for key, tr in traces.items()}  # fmt: skip
    timing = json.loads((out / "grid_time.json").read_text())
    costs = {}
    fits = None
    for key in sorted({profile_key(s.name, t) for s in cfg.settings for t in cfg.temperatures}):
        path = out / profile_file(key)
        if cfg.profile is not None:
            costs[key] = read_profile_csv(cfg.profile / path.name)
            continue
        if fits is None:
            steps = pd.read_parquet(out / "calibration_steps.parquet")
            steps = calibration_loads(calibration_steps(steps, cfg.step_clock), cfg)
            fits = fit_kinds(steps, cfg.temperatures, cfg.terms)
        drafter, t = key
        if drafter not in fits:
            kind = "draft-model" if drafter else "target-only"
            raise SpecsimError(
                f"--terms by_kind: no calibration step of a {kind} server to fit; calibrate "
                "such a setting, or leave by_kind out"
            )
        at = ",".join(map(str, cfg.calib_concurrency))
        meta = {"threads": str(cfg.threads), "parallel": str(cfg.parallel),
                "calibration": f"{cfg.calib_prompts} at C={at}"}  # fmt: skip
        name = f"llama-server-smollm2{'-drafter' if drafter else ''}-t{t:g}"
        cm = cost_model(fits[drafter], t, name, limits(cfg), meta, drafter=drafter)
        write_profile_csv(cm, path, force=True)
        costs[key] = read_profile_csv(path)  # the simulator reads what was written
    table = compare(cfg, runs_df, draws, costs)
    write_table(table, out / "fidelity.csv")
    drift = None
    if cfg.drift_probe:  # the same runs, each simulated at its round's speed
        probes = pd.read_csv(out / "probes.csv")
        drifted = compare(cfg, runs_df, draws, costs, probes)
        write_table(drifted, out / "fidelity-drift.csv")
        drift = (probes, drifted)
    ranks = pd.concat([rankings(table, "throughput_tok_s").assign(metric="throughput"),
                       rankings(table, "tpot_ms_mean").assign(metric="tpot")])  # fmt: skip
    write_table(ranks, out / "rankings.csv")
    conf = {k: (str(v) if not isinstance(v, (int, float, str, bool, type(None), tuple)) else v)
            for k, v in asdict(cfg).items() if k != "rescore"}  # fmt: skip
    write_text(json.dumps(jsonable(conf), indent=1, default=str) + "\n", out / "config.json")
    if cfg.rescore and not timing.get("rescored"):
        timing["rescored"] = True
        write_text(json.dumps(timing, indent=1) + "\n", out / "grid_time.json")
    load = (tuple(timing["load_before"]), tuple(timing["load_after"]))
    write_report(cfg, table, ranks, timing["minutes"], load, bool(timing.get("rescored")),
                 timing.get("command", ""), drift)  # fmt: skip
    return table


__all__ = ["LlamaValidationConfig", "SpecSetting", "measure", "run_llama_validation", "score"]
