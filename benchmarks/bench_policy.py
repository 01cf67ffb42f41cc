"""Decision time of each scheduler: CPU microseconds for one decision over R requests.

Rows are drawn from the synthetic chat trace (7-token blocks), lagged rows from the same trace,
and ``auto`` gets a verification history filled by a replay, so every policy does its real
work. The ``profile sched`` column is what the engine charges for one decision (the profile's
``sched_base_us + sched_us_per_request * R``); a policy whose decision takes longer than that
is under-charged by the simulator. Run on an idle core (issue #16 asks for R = 256):

    python benchmarks/bench_policy.py
    python benchmarks/bench_policy.py --profile v4-flash-8xh20 --sizes 1,16,64,256
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _history(trace_path: Path) -> np.ndarray:
    """The history ``auto`` has after a 64-request replay of the trace (the engine's own)."""
    from specsim.policies import Policy, StepInput, get_policy
    from specsim.sim.simulate import replay

    last: list[np.ndarray] = []
    auto = get_policy("auto")

    def keep(inp: StepInput) -> np.ndarray:
        last[:] = [inp.accept_hist.copy()]
        return auto.schedule(inp)

    spy = Policy(name="spy", schedule=keep, zos=True, needs=auto.needs)
    replay(trace_path, spy, concurrency=64, requests=400, profile="v4-flash-8xh20")
    return last[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(ROOT / "traces" / "synthetic-chat.parquet"))
    ap.add_argument("--profile", default="v4-flash-8xh20")
    ap.add_argument("--sizes", default="1,16,64,256")
    ap.add_argument("--policies", default="auto,zos,hw-aware,goodput,mtp1")
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()

    from specsim.policies import StepInput, get_policy
    from specsim.sim.cost.profiles import get_profile
    from specsim.trace.io import read_trace

    tr = read_trace(args.trace)
    cost = get_profile(args.profile)
    hist = _history(Path(args.trace))
    rng = np.random.default_rng(0)
    print(f"{'policy':<10} {'R':>5} {'us/decision (median)':>22} {'profile sched us':>17}")
    for name in args.policies.split(","):
        pol = get_policy(name)
        for r in (int(x) for x in args.sizes.split(",")):
            rows = rng.integers(0, tr.n_rows, size=r)
            lag = rng.integers(0, tr.n_rows, size=r)
            inp = StepInput(
                conf=tr.conf[rows],
                step_time=cost.step_time_fn(None),
                lagged_conf=tr.conf[lag],
                accept_rate=np.full(tr.block_size, 0.7),
                accept_hist=hist,
                request_class=np.zeros(r, np.int64),
                rng=np.random.default_rng(1),
            )
            times = []
            for _ in range(args.repeat):
                t = time.process_time_ns()
                pol.schedule(inp)
                times.append(time.process_time_ns() - t)
            med = float(np.median(times)) / 1e3
            print(f"{name:<10} {r:>5} {med:>22.1f} {cost.sched_s(r) * 1e6:>17.1f}")


if __name__ == "__main__":
    main()
