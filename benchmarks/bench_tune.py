"""``specsim tune`` speed (issue 47's goal): wall seconds of one load and of a 6-load sweep.

Goal on a 2-core laptop: one load in under a minute, a 6-load sweep in under 5 minutes, for each
engine's default grid (the trace's block of 7: vllm 15 settings, trtllm 35, sglang 8, llama 43).
Scenario: a shipped trace (``--trace``, chat), ``--profile`` (llama-3-8b-h100), the default
requests per load (max(100, 4C) in a closed loop), a TPOT SLA of 10 ms, seed 0; one load at
``--one`` (64 in flight), the sweep at ``--sweep`` (1,4,16,64,128,256). Each (engine, scenario)
runs ``specsim tune`` in a fresh process (as a user runs it: imports and trace read included),
so its wall time is the user's; ``--workers`` is passed through (1: one process).

    python benchmarks/bench_tune.py                                  # every engine, both
    python benchmarks/bench_tune.py --engines trtllm --workers 2     # the largest grid, 2 cores
    python benchmarks/bench_tune.py --one 8 --sweep 2,8 --requests 40   # smoke run (seconds)

Prints one line per run and a closing table; ``--json`` prints the rows as one JSON object.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

ENGINES = ("vllm", "trtllm", "sglang", "llama")
GOALS_S = {"one load": 60.0, "6-load sweep": 300.0}


def _run(engine: str, loads: str, args: argparse.Namespace) -> dict:
    """One ``specsim tune --json`` in a fresh process: wall seconds, replays, best per load."""
    cmd = [
        sys.executable, "-m", "specsim.cli", "tune", args.trace, "--engine", engine,
        "--concurrency", loads, "--profile", args.profile, "--slo", args.slo,
        "--seed", "0", "--workers", str(args.workers), "--json",
    ]  # fmt: skip
    if args.requests is not None:
        cmd += ["--requests", str(args.requests)]
    t0 = time.perf_counter()
    run = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if run.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({run.returncode}): {run.stderr.strip()}")
    obj = json.loads(run.stdout)
    return {
        "engine": engine,
        "loads": loads,
        "n_loads": len(obj["loads"]),
        "replays": sum(len(lr["rows"]) for lr in obj["loads"]),
        "wall_s": round(wall, 2),
        "best": [lr["best"]["candidate"] if lr["best"] else None for lr in obj["loads"]],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engines", default=",".join(ENGINES), help="comma-separated engines")
    p.add_argument("--trace", default="chat", help="trace (a shipped name or a .parquet)")
    p.add_argument("--profile", default="llama-3-8b-h100")
    p.add_argument("--slo", default="tpot=10", help="the SLA tune scores against")
    p.add_argument("--one", default="64", help="the one-load scenario's concurrency")
    p.add_argument("--sweep", default="1,4,16,64,128,256", help="the sweep's concurrencies")
    p.add_argument("--requests", type=int, default=None, help="requests per replay")
    p.add_argument("--workers", type=int, default=1, help="tune --workers (default 1)")
    p.add_argument("--json", action="store_true", help="print the rows as one JSON object")
    args = p.parse_args(argv)
    rows = []
    for engine in [e.strip() for e in args.engines.split(",") if e.strip()]:
        for scenario, loads in (("one load", args.one), ("6-load sweep", args.sweep)):
            row = {"scenario": scenario, **_run(engine, loads, args)}
            rows.append(row)
            if not args.json:
                print(f"{engine:7s} {scenario:13s} {row['replays']:4d} replays "
                      f"{row['wall_s']:7.2f} s  best: {', '.join(map(str, row['best']))}",
                      flush=True)  # fmt: skip
    if args.json:
        print(json.dumps({"workers": args.workers, "rows": rows}, sort_keys=True))
        return 0
    print("\nscenario       engine   wall s   goal s  met")
    for r in rows:
        goal = GOALS_S[r["scenario"]]
        print(f"{r['scenario']:13s}  {r['engine']:7s} {r['wall_s']:7.2f}  {goal:7.0f}  "
              f"{'yes' if r['wall_s'] <= goal else 'NO'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
