"""Phase 2 of a ``--target-ci`` grid: every setting's server up at once, the cells round-robin
over all of them (:func:`specsim.fidelity.llama.grid.interleaved_runs`), and what is measured
between the rounds: the drift probe (``--drift-probe``, :mod:`.drift`) and, with
``--calib-schedule rounds``, a pass of every setting's calibration loads after every round.

Why calibrate between the rounds: a calibration in one go before the grid measures the machine
in one phase and the cells in others; on a shared 2-core VM the two were 1.4-1.7x apart at
the calibration's higher loads (reports/llama-cpp-v4/held-out-8/NOTES.md). Calibration
passes spread over the rounds sample the same phases as the cells they price, and the profile
is fitted on all of them.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pandas as pd

from specsim.fidelity.llama.config import LlamaValidationConfig
from specsim.fidelity.llama.traces import GridInputs


def measure_rounds(
    cfg: LlamaValidationConfig,
    inputs: GridInputs,
    traces: dict,
    out: Path,
    log: Callable[[str], None],
) -> tuple[list[dict], list[pd.DataFrame], list[dict], list[dict]]:
    """Every setting's server (and, with ``--step-clock server``, its logging calibration
    server), the calibration as ``--calib-schedule`` says, the rounds, and the probes:
    returns the runs, the calibration steps and rows, and the probes."""
    from specsim.fidelity.llama.calibrate import calibration_server, keep_calibration_log
    from specsim.fidelity.llama.grid import interleaved_runs
    from specsim.fidelity.llama.servers import start_server

    assert cfg.target_ci is not None
    steps: list[pd.DataFrame] = []
    calib_rows: list[dict] = []
    probes: list[dict] = []
    between = cfg.calib_schedule == "rounds"
    with ExitStack() as stack:
        servers: dict[str, Any] = {}
        cals: dict[str, Any] = {}  # --calib-schedule rounds: each setting's, until the end
        for s in cfg.settings:
            log(f"phase 2: {s.name}: server" + (", calibration" if cfg.profile is None else ""))
            if cfg.profile is None and cfg.step_clock == "server":  # a logging server its own
                cm = calibration_server(cfg, s, out)
                if between:  # up for the whole grid
                    cals[s.name] = _warm(cfg, s, stack.enter_context(cm), inputs, log)
                else:  # calibrated now, down before the grid's server starts
                    with cm as cal_srv:
                        cal = _warm(cfg, s, cal_srv, inputs, log)
                        cal.run_loads()
                    keep_calibration_log(s, out)
                    _keep(cal.finish(), steps, calib_rows)
            servers[s.name] = stack.enter_context(start_server(cfg, s, out / "logs"))
            if cfg.profile is None and cfg.step_clock == "client":
                cal = _warm(cfg, s, servers[s.name], inputs, log)
                if between:
                    cals[s.name] = cal
                else:
                    cal.run_loads()
                    _keep(cal.finish(), steps, calib_rows)

        def after(rnd: int) -> None:
            if cfg.drift_probe:  # the machine's speed, between the rounds (drift.py)
                from specsim.fidelity.llama.drift import probe

                probes.append(probe(cfg, servers["none"], inputs.calib_ids,
                                    inputs.calib_lengths, rnd, log))  # fmt: skip
            if between and rnd >= 0:
                log(f"  calibration pass after round {rnd}")
                for cal in cals.values():
                    cal.run_loads(rnd)

        log(f"phase 2: the grid, repeated until +-{100 * cfg.target_ci:g}% (round-robin)")
        runs = interleaved_runs(cfg, servers, inputs, traces, log, after)
    for cal in cals.values():  # the servers are down: rebuild the drafts, keep the logs
        if cfg.step_clock == "server":
            keep_calibration_log(cal.s, out)
        _keep(cal.finish(), steps, calib_rows)
    return runs, steps, calib_rows, probes


def _warm(cfg, s, srv, inputs: GridInputs, log) -> Any:  # noqa: ANN001
    """A setting's calibration on ``srv``, its server warmed up."""
    from specsim.fidelity.llama.calibrate import Calibration

    cal = Calibration(cfg, s, srv, inputs.calib_ids, inputs.calib_lengths, log)
    cal.warm()
    return cal


def _keep(done: tuple[pd.DataFrame, list[dict]], steps: list, rows: list) -> None:
    steps.append(done[0])
    rows += done[1]
