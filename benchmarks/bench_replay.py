"""Simulator speed: simulated output tokens per wall-clock second of ``specsim.sim.replay``.

Scenarios (``hw-aware`` on a synthetic chat trace of 7-token blocks, h100-dense-8b profile):
- closed loop at 64, 128 and 256 concurrent requests;
- the Azure conversation arrivals (built-in ``azure-conv``), time-compressed by
  ``--azure-speedup`` so that 64+ requests run at once (the raw trace averages only a few).

Each scenario runs ``--repeat`` times and reports the best (least disturbed) wall time and the
best process CPU time (what one core spent, robust to other processes sharing the machine);
the trace is generated once, outside the timing. Run on an idle core:

    python benchmarks/bench_replay.py                 # all scenarios
    python benchmarks/bench_replay.py --cprofile out.prof --only closed-128

Goal: 1,000,000 simulated tokens/s on one core (benchmarks/README.md has the measured figures).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings

import numpy as np


def _trace(n_requests: int, seed: int):
    from specsim.trace.synth import PROFILES, LogNormal, synth_trace

    return synth_trace(
        n_requests=n_requests,
        accept_profile=PROFILES["chat"],
        output_len=LogNormal(300, 0.5, 20, 2000),
        prompt_len=LogNormal(512, 0.8, 16, 4096),
        seed=seed,
    )


def _compressed_azure(path: str, factor: float, n: int) -> None:
    """The first ``n`` Azure conversation arrivals with times divided by ``factor``."""
    from specsim.sim.workload import read_arrivals

    _, t, p, d = read_arrivals("azure-conv")
    with open(path, "w") as fh:
        fh.write("arrived_at,num_prefill_tokens,num_decode_tokens\n")
        for ti, pi, di in zip(t[:n] / factor, p[:n], d[:n], strict=True):
            fh.write(f"{ti:.6f},{pi},{di}\n")


def scenarios(args, tmp: str) -> dict[str, dict]:
    out = {f"closed-{c}": {"concurrency": c, "requests": args.requests} for c in (64, 128, 256)}
    # The raw Azure conversation trace keeps only a few requests in flight; dividing its
    # arrival times by --azure-speedup (default 4.5) keeps about 64-128 running on h100-dense-8b
    # (4x: ~52, 6x: saturated at max_running 256). The table prints the realised mean.
    path = os.path.join(tmp, "azure-conv-compressed.csv")
    _compressed_azure(path, args.azure_speedup, args.requests)
    out[f"azure-conv-x{args.azure_speedup:g}"] = {"arrivals": path}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=3000, help="requests per scenario (3000)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per scenario; best is kept (3)")
    ap.add_argument("--policy", default="hw-aware")
    ap.add_argument("--profile", default="h100-dense-8b")
    ap.add_argument("--azure-speedup", type=float, default=4.5, help="arrival time divisor (4.5)")
    ap.add_argument("--only", default=None, help="run one scenario by name")
    ap.add_argument("--cprofile", default=None, metavar="FILE", help="write cProfile stats")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")  # extrapolation notes are not the point here
    from specsim.sim.replay import replay

    trace = _trace(1000, seed=0)
    print(f"python {sys.version.split()[0]}, numpy {np.__version__}, policy {args.policy}")
    print(
        f"{'scenario':<20}{'tokens':>10}{'steps':>8}{'mean R':>8}{'wall s':>8}{'cpu s':>8}"
        f"{'tok/wall s':>12}{'tok/cpu s':>12}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for name, load in scenarios(args, tmp).items():
            if args.only and name != args.only and not name.startswith(args.only):
                continue
            best, best_cpu, res = float("inf"), float("inf"), None
            for _ in range(args.repeat):
                t0, c0 = time.perf_counter(), time.process_time()
                res = replay(
                    trace,
                    args.policy,
                    profile=args.profile,
                    seed=1,
                    record_tokens=False,
                    **load,
                )
                best = min(best, time.perf_counter() - t0)
                best_cpu = min(best_cpu, time.process_time() - c0)
            if args.cprofile:
                import cProfile

                cProfile.runctx(
                    "replay(trace, args.policy, profile=args.profile, seed=1, "
                    "record_tokens=False, **load)",
                    globals(),
                    {"replay": replay, "trace": trace, "args": args, "load": load},
                    args.cprofile,
                )
            s = res.summary
            steps = res.steps
            dur = steps["duration_s"].to_numpy()
            mean_r = float((steps["running"].to_numpy() * dur).sum() / dur.sum())
            tok = s["output_tokens"]
            print(
                f"{name:<20}{tok:>10,}{s['engine_steps']:>8,}{mean_r:>8.1f}{best:>8.2f}"
                f"{best_cpu:>8.2f}{tok / best:>12,.0f}{tok / best_cpu:>12,.0f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
