"""Replay every kept run of a llama-server fidelity grid with the slots its server logged.

Why: llama-server with one KV stream per slot cuts a step into a pass per run of consecutive
slots (specsim/sim/ubatch.py), so what a step costs depends on where the requests sit, and the
simulator, which cannot know a server's history, puts them in the lowest free slots. The grid
server's info-level log names the slot of every task (``launch_slot_: id S | task T``); giving
each simulated request the slot its real one had (the lowest free one where the simulated
timing has it busy) separates the step model's error from the slot layout's. A diagnostic of
a grid already run, never a prediction: it reads the real runs' slots. A grid whose runs each
sent their own draw of jobs (``--arrival-seeds per-run``) is replayed run by run on that draw.

    python scripts/replay_logged_slots.py reports/llama-cpp-v4/held-out-3

writes ``logged-slots.csv`` in the report (one row per kept run: the real run's throughput and
mean TPOT, the simulator's with the logged slots and with the lowest free slots) and prints
each cell's median errors. The profiles are the report's own (``profile-*.csv``).
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

_LAUNCH = re.compile(r"launch_slot_: id\s+(\d+) \| task (\d+)")


def logged_slots(log: Path) -> list[int]:
    """The slot of every task the server launched, in launch order."""
    text = log.read_text(errors="replace")
    return [int(m.group(1)) for m in _LAUNCH.finditer(text)]


class LoggedSlots:
    """The slot choice of a real run: the i-th request admitted gets the i-th logged slot, or
    the lowest free one where that one is busy in the simulated run (counted)."""

    def __init__(self, slots: list[int]) -> None:
        self.slots, self.i, self.fallbacks = list(slots), 0, 0

    def attach(self, n_requests: int, max_running: int) -> LoggedSlots:  # noqa: ARG002
        return self

    def choose(self, busy: np.ndarray, prompt: int) -> int:  # noqa: ARG002
        s = self.slots[self.i] if self.i < len(self.slots) else -1
        self.i += 1
        if s < 0 or s >= busy.shape[0] or busy[s]:
            self.fallbacks += 1
            s = int(np.flatnonzero(~busy)[0])
        return s

    def release(self, slots: np.ndarray, now: float) -> None:  # noqa: ARG002
        return None


def replay_runs(report: Path, specs: tuple[str, ...] | None = None) -> pd.DataFrame:
    """One row per kept run of ``report`` (of the settings ``specs`` names, default all):
    real, logged-slot and lowest-slot numbers."""
    from specsim.cli import build_parser
    from specsim.errors import SpecsimError
    from specsim.fidelity.llama import trace_path
    from specsim.fidelity.llama.config import (
        LlamaValidationConfig,
        profile_file,
        profile_key,
    )
    from specsim.fidelity.llama.grid import logged_seed, simulate_cell
    from specsim.options import from_args
    from specsim.sim.cost.profiles import read_profile_csv
    from specsim.trace.io import read_trace

    need = [report / "runs.csv", report / "grid_time.json"]
    missing = [p for p in need if not p.exists()]
    if missing:
        raise SpecsimError(f"{missing[0]} is missing: give a llama-server grid's report folder")
    command = json.loads((report / "grid_time.json").read_text())["command"]
    args = build_parser().parse_args(shlex.split(command)[1:])
    cfg = from_args(LlamaValidationConfig, args, seed=0, threads=args.server_threads)
    cfg = cfg.with_(out=report)
    runs = pd.read_csv(report / "runs.csv")
    rows = []
    for s in cfg.settings:
        if specs is not None and s.name not in specs:
            continue
        log = report / "logs" / f"server-{s.slug}.log"
        if not log.exists():
            raise SpecsimError(f"{log} is missing: the grid's server logs are needed")
        slots = logged_slots(log)
        mine = runs[runs["spec"] == s.name]
        if len(slots) != int(mine["requests"].sum()):
            raise SpecsimError(
                f"{log.name} launched {len(slots)} tasks, runs.csv lists "
                f"{int(mine['requests'].sum())} requests of {s.name}: not this grid's log"
            )
        at, inputs = 0, {}
        for _, r in mine.iterrows():
            seq = slots[at : at + int(r["requests"])]
            at += int(r["requests"])
            if bool(r["warmup"]):
                continue
            t = float(r["temperature"])
            c = None if pd.isna(r["concurrency"]) else int(r["concurrency"])
            rate = None if pd.isna(r["rate"]) else float(r["rate"])
            if t not in inputs:  # each temperature's trace and profile, read once
                inputs[t] = (
                    read_trace(trace_path(report, s.name, t)),
                    read_profile_csv(report / profile_file(profile_key(s.name, t))),
                )
            trace, cost = inputs[t]
            rule, seed = LoggedSlots(seq), logged_seed(cfg, r)  # the run's own draw of jobs
            got = simulate_cell(cfg, s, trace, cost, c, rate, slots=rule, seed=seed)
            low = simulate_cell(cfg, s, trace, cost, c, rate, seed=seed)
            rows.append({"spec": s.name, "temperature": t, "concurrency": c, "rate": rate,
                         "repeat": int(r["repeat"]), "arrival_seed": seed,
                         "real_throughput_tok_s": r["throughput_tok_s"],
                         "logged_throughput_tok_s": got["throughput_tok_s"],
                         "lowest_throughput_tok_s": low["throughput_tok_s"],
                         "real_tpot_ms_mean": r["tpot_ms_mean"],
                         "logged_tpot_ms_mean": got["tpot_ms_mean"],
                         "lowest_tpot_ms_mean": low["tpot_ms_mean"],
                         "fallbacks": rule.fallbacks, "requests": int(r["requests"])})  # fmt: skip
    return pd.DataFrame(rows)


def cell_errors(table: pd.DataFrame) -> pd.DataFrame:
    """Each cell's median over its runs, and the signed errors against the real median."""
    keys = ["spec", "temperature", "concurrency", "rate"]
    m = table.groupby(keys, dropna=False, sort=False).median(numeric_only=True).reset_index()
    for metric in ("throughput_tok_s", "tpot_ms_mean"):
        for side in ("logged", "lowest"):
            m[f"err_{side}_{metric}"] = m[f"{side}_{metric}"] / m[f"real_{metric}"] - 1.0
    return m


def main(argv: list[str] | None = None) -> int:
    from specsim.errors import LineParser, run_script

    ap = LineParser(prog="replay_logged_slots.py", description=__doc__.split("\n")[0])
    ap.add_argument("report", type=Path, help="a llama-server fidelity grid's report folder")
    ap.add_argument("--specs", default=None, help="settings to replay (default: all)")
    ap.add_argument("--force", action="store_true", help="overwrite logged-slots.csv")
    args = ap.parse_args(argv)
    return run_script(ap.prog, lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    from specsim.outputs import check_out, write_table

    out = check_out(args.report / "logged-slots.csv", force=args.force, suffixes=(".csv",))
    table = replay_runs(args.report, None if args.specs is None else tuple(args.specs.split(",")))
    write_table(table, out)
    cells = cell_errors(table)
    cols = ["spec", "temperature", "concurrency", "rate", "err_logged_tpot_ms_mean",
            "err_lowest_tpot_ms_mean", "err_logged_throughput_tok_s",
            "err_lowest_throughput_tok_s"]  # fmt: skip
    print(cells[cols].to_string(index=False, float_format=lambda v: f"{v:+.3f}"))
    for side in ("logged", "lowest"):
        tp = cells[f"err_{side}_tpot_ms_mean"].abs().median()
        th = cells[f"err_{side}_throughput_tok_s"].abs().median()
        print(f"{side} slots: throughput median |error| {100 * th:.1f}%, mean TPOT {100 * tp:.1f}%")
    print(f"wrote {len(table)} runs to {out} ({int(table['fallbacks'].sum())} fallbacks)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
