"""Streaming results (issue 50): CPU seconds and peak RSS of a day-sized replay, with and without
``stream=True``.

Scenario: ``hw-aware``, closed loop at ``--concurrency`` (256) on a synthetic chat trace of
7-token blocks (the one ``bench_replay.py`` uses), its profile, serving model v2, lean
(``record_steps=False, record_tokens=False``), at each of ``--sizes`` requests. Two modes:

- ``lean``: today's lean replay: every request's row kept, the summary computed at the end;
- ``stream``: ``stream=True``: the summary accumulated as requests finish, slots of finished
  jobs reused, no per-request rows (``--out DIR`` also streams them to Parquet per run);
- ``bound``: ``numpy_bound.bound_loop_v2``, the bare numpy loop doing the same accounting, on
  the same workload: each mode's CPU over the bound's, measured in the same run, is the ratio
  that carries from one machine to another.

Each (mode, size) runs in a fresh process, so its peak RSS (``ru_maxrss``) is its own; the
report gives the replay's CPU seconds (``time.process_time`` around ``replay``), the whole
process's CPU seconds (imports and trace generation included), peak RSS and its ratio to the
same mode's smallest run (goal: within 10% at 1M), and, for each size run in both modes, how
many summary values differ (goal: none but the percentiles past ``stream_exact_rows``, and
those within the sketch's 0.5%).

    python benchmarks/bench_streaming.py                         # 10k, 100k, 1M
    python benchmarks/bench_streaming.py --sizes 10000000 --modes stream   # lean 10M
    python benchmarks/bench_streaming.py --sizes 10000 --modes lean,stream  # smoke run
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time

WALL_KEYS = ("wall_time_s", "sim_tokens_per_wall_s")


def _child(args: argparse.Namespace) -> None:
    """One run in this process; prints one JSON line."""
    t_proc = time.process_time()
    import warnings

    from specsim.sim.simulate import replay
    from specsim.trace.synth import PROFILES, LogNormal, synth_trace

    tr = synth_trace(
        n_requests=2000,
        accept_profile=PROFILES["chat"],
        output_len=LogNormal(300, 0.5, 20, 2000),
        prompt_len=LogNormal(512, 0.8, 16, 4096),
        seed=0,
    )
    opts = dict(
        concurrency=args.concurrency,
        requests=args.child_size,
        profile=args.profile,
        record_steps=False,
        record_tokens=False,
        sla_tps=args.sla_tps,
        slo="ttft=500,tpot=25",
    )
    if args.child_mode == "stream":
        opts["stream"] = True
        if args.out:
            opts["requests_out"] = os.path.join(args.out, f"requests-{args.child_size}.parquet")
    os.environ.setdefault("SPECSIM_MAX_REQUESTS", str(max(args.child_size, 5_000_000)))
    if args.child_mode == "bound":
        _child_bound(tr, args, t_proc)
        return
    t0 = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = replay(tr, "hw-aware", **opts)
    cpu_replay = time.process_time() - t0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    summary = {k: v for k, v in res.summary.items() if k not in WALL_KEYS}
    print(
        json.dumps(
            {
                "mode": args.child_mode,
                "requests": args.child_size,
                "cpu_replay_s": cpu_replay,
                "cpu_process_s": time.process_time() - t_proc + 0.0,
                "peak_rss_mb": usage.ru_maxrss / 1024.0,  # Linux: kilobytes
                "summary": summary,
                "stream": res.config.get("stream"),
            },
            default=float,
        )
    )


def _child_bound(tr, args: argparse.Namespace, t_proc: float) -> None:
    """The numpy bound (``numpy_bound.bound_loop_v2``: the bare loop doing serving model v2's
    accounting) on the same workload, so the engine's CPU can be given as a ratio to it
    measured in the same run (the ratio, not the absolute time, carries across machines)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from numpy_bound import bound_loop_v2

    from specsim.policies.base import get_policy
    from specsim.sim.cost.profiles import get_profile
    from specsim.sim.workload import make_workload

    cost = get_profile(args.profile)
    wl = make_workload(tr, concurrency=args.concurrency, requests=args.child_size, seed=0)
    t0 = time.process_time()
    tokens, steps, sim_s = bound_loop_v2(tr, get_policy("hw-aware"), cost, wl)
    cpu = time.process_time() - t0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(
        json.dumps(
            {
                "mode": "bound",
                "requests": args.child_size,
                "cpu_replay_s": cpu,
                "cpu_process_s": time.process_time() - t_proc + 0.0,
                "peak_rss_mb": usage.ru_maxrss / 1024.0,
                "summary": {"output_tokens": tokens, "engine_steps": steps, "sim_time_s": sim_s},
            },
            default=float,
        )
    )


def _run(mode: str, size: int, args: argparse.Namespace) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child-mode",
        mode,
        "--child-size",
        str(size),
        "--concurrency",
        str(args.concurrency),
        "--profile",
        args.profile,
        "--sla-tps",
        str(args.sla_tps),
    ]
    if args.out:
        cmd += ["--out", args.out]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{mode} at {size} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _diff(a: dict, b: dict) -> list[str]:
    out = []
    for k, x in a.items():
        y = b.get(k)
        same = x == y or (
            isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)
        )
        if not same:
            rel = abs(y - x) / abs(x) if isinstance(x, float) and x else float("nan")
            out.append(f"{k} ({rel:.2e})")
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="10000,100000,1000000")
    p.add_argument("--modes", default="lean,stream,bound")
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--profile", default="vllm-v4-flash-tp4-b300")
    p.add_argument("--sla-tps", type=float, default=60.0)
    p.add_argument("--out", help="stream mode: write each run's per-request Parquet here")
    p.add_argument("--child-mode", help=argparse.SUPPRESS)
    p.add_argument("--child-size", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child_mode:
        _child(args)
        return
    sizes = [int(float(s)) for s in args.sizes.split(",") if s]
    modes = [m for m in args.modes.split(",") if m]
    rows: dict[tuple[str, int], dict] = {}
    print(
        f"{'mode':7} {'requests':>10} {'CPU replay s':>13} {'CPU process s':>14} "
        f"{'peak RSS MB':>12} {'RSS / first':>12}"
    )
    for mode in modes:
        first = None
        for size in sizes:
            r = _run(mode, size, args)
            rows[(mode, size)] = r
            first = first or r["peak_rss_mb"]
            print(
                f"{mode:7} {size:>10,} {r['cpu_replay_s']:>13.2f} {r['cpu_process_s']:>14.2f} "
                f"{r['peak_rss_mb']:>12.1f} {r['peak_rss_mb'] / first:>12.3f}",
                flush=True,
            )
    for size in sizes:
        b = rows.get(("bound", size))
        for mode in ("lean", "stream"):
            r = rows.get((mode, size))
            if b and r:
                same = all(
                    r["summary"].get(k) == b["summary"][k]
                    for k in ("output_tokens", "engine_steps")
                )
                print(
                    f"{size:,} requests: {mode} CPU / numpy bound CPU = "
                    f"{r['cpu_replay_s'] / b['cpu_replay_s']:.2f}"
                    f" (same tokens and steps: {'yes' if same else 'NO'})"
                )
        if ("lean", size) in rows and ("stream", size) in rows:
            a, b = rows[("lean", size)], rows[("stream", size)]
            d = _diff(a["summary"], b["summary"])
            how = (b.get("stream") or {}).get("percentiles")
            print(f"{size:,} requests: stream vs lean, {len(d)} values differ ({how}): {d}")


if __name__ == "__main__":
    main()
