"""``specsim bench``: load a running server (llama-server, vLLM, SGLang) and measure it with the
simulator's metrics.

specsim bench --url http://127.0.0.1:8080 --prompts mt-bench --concurrency 8 --max-tokens 128
specsim bench --url http://127.0.0.1:8000 --api completions --model m --rate 4 --requests 200

Every request is bounded in time (--connect-timeout-s, --first-byte-timeout-s,
--event-timeout-s, --timeout-s): a server that stalls is a failed request whose error names
the bound it hit. Exit codes: 0 when the requests went through (failures within
--max-failed-share), 1 when more failed or none completed, 2 for a bad flag or file, 130 after
Ctrl-C (SIGINT) and 143 after SIGTERM (128 + the signal, as a shell reports a killed process):
a stopped run prints the summary of what it measured and writes --out, marked partial.
"""

from __future__ import annotations

import argparse
import json
import math
import sys


def register(sub: argparse._SubParsersAction) -> None:
    from specsim.options import add_options
    from specsim.serve.bench_config import BenchConfig

    p = sub.add_parser(
        "bench",
        help="load a running OpenAI-compatible or llama.cpp server and measure it like a replay",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n")[2],  # the time bounds and the exit codes
    )
    p.add_argument(
        "--prompts",
        nargs="+",
        required=True,
        help="prompt sets (bundled names such as mt-bench or gsm8k[:80], or JSONL files with "
        "a 'turns' list per line); the first turn of each is sent",
    )
    add_options(p, BenchConfig)
    p.add_argument("--out", metavar="FILE", help="write the per-request table (.parquet/.csv)")
    p.add_argument("--force", action="store_true", help="overwrite --out")
    p.add_argument("--json", action="store_true", help="print one JSON object (summary+config)")
    p.set_defaults(func=run)


def _fmt(x: float, spec: str) -> str:
    return "n/a" if x is None or not math.isfinite(float(x)) else f"{x:{spec}}"


SERVER = "for the server (all its GPUs)"


def table(s: dict) -> str:
    def pcts(name: str) -> str:
        return " / ".join(_fmt(s[f"{name}_ms_p{q}"], ".1f") for q in (50, 90, 99)) + " ms"

    rows = [
        ("successful requests", f"{s['requests_completed']:,} ({s['requests_failed']} failed)"),
        ("benchmark duration", f"{_fmt(s['duration_s'], '.2f')} s"),
        # a client sees the server whole: every throughput is the deployment's, all its GPUs
        ("output throughput", f"{_fmt(s['throughput_tok_s'], ',.1f')} tok/s {SERVER}"),
        (
            "steady-state throughput",
            f"{_fmt(s['steady_throughput_tok_s'], ',.1f')} tok/s {SERVER}",
        ),
        ("request throughput", f"{_fmt(s['request_throughput'], '.3f')} req/s {SERVER}"),
        ("TTFT mean, p50 / p90 / p99", f"{_fmt(s['ttft_ms_mean'], '.1f')} ms, {pcts('ttft')}"),
        ("TPOT mean, p50 / p90 / p99", f"{_fmt(s['tpot_ms_mean'], '.2f')} ms, {pcts('tpot')}"),
        ("ITL mean, p50 / p90 / p99", f"{_fmt(s['itl_ms_mean'], '.2f')} ms, {pcts('itl')}"),
        ("E2E mean, p50 / p90 / p99", f"{_fmt(s['e2e_ms_mean'], ',.0f')} ms, {pcts('e2e')}"),
    ]
    if "draft_tokens" in s:
        rate = (
            f"{_fmt(100 * s['verify_efficiency'], '.1f')}% accepted"
            if "verify_efficiency" in s
            else "the server drafted nothing"
        )
        rows.append(
            (
                "drafted / accepted tokens",
                f"{s['draft_tokens']:,} / {s['accepted_draft_tokens']:,} ({rate})",
            )
        )
    if "goodput_req_s" in s:
        rows.append(("goodput", f"{_fmt(s['goodput_req_s'], '.3f')} req/s meet the SLOs"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def run(args: argparse.Namespace) -> int:
    from specsim.errors import Interrupted, RunFailed
    from specsim.options import from_args
    from specsim.outputs import check_out, jsonable, write_table
    from specsim.progress import Progress
    from specsim.prompts import load_many
    from specsim.serve.bench import (
        BenchInterrupted,
        make_jobs,
        result_frame,
        run_bench,
        summarize_bench,
    )
    from specsim.serve.bench_config import BenchConfig
    from specsim.sim.metrics import parse_slo

    cfg = from_args(BenchConfig, args)
    slo = parse_slo(cfg.slo)
    out = None if args.out is None else check_out(args.out, force=args.force)
    prompts = [p.text for p in load_many(list(args.prompts))]
    jobs = make_jobs(prompts, cfg)
    stop: BenchInterrupted | None = None
    with Progress(len(jobs), "bench", " req") as bar:
        try:
            results = run_bench(cfg, jobs, progress=bar)
        except BenchInterrupted as exc:  # Ctrl-C / SIGTERM: keep what was measured
            stop, results = exc, exc.results
    summary = summarize_bench(results, cfg.concurrency, slo)
    failed = [r.error for r in results if r.error]
    over = len(failed) > cfg.max_failed_share * len(results) or not summary["requests_completed"]
    if out is not None:
        frame = result_frame(results)
        # some rows are failures, or the run was stopped: the table is not the whole run
        frame["partial"] = bool(failed) or stop is not None
        write_table(frame, out)
    if args.json:
        extra = {"interrupted": stop.signum} if stop is not None else {}
        print(json.dumps(jsonable({**summary, **extra, "config": cfg.__dict__}), sort_keys=True))
    else:
        print(table(summary))
    kept = f"; the per-request table is in {out} (marked partial)" if out is not None else ""
    if stop is not None:
        done = int(summary["requests_completed"])
        raise Interrupted(
            f"{stop} after {done} of {stop.total} requests completed ({len(failed)} failed or "
            f"cut short, {stop.total - len(results)} not sent){kept}",
            stop.signum,
        )
    if over:
        raise RunFailed(
            f"{len(failed)} of {len(results)} requests failed (allowed: "
            f"{cfg.max_failed_share:.0%}); first error: {failed[0] if failed else 'none'}{kept}"
        )
    bad = [k for k in HEADLINE if not (math.isfinite(summary[k]) and summary[k] >= 0)]
    if bad:  # every request's numbers were checked: this is a run too short to time
        raise RunFailed(
            f"the run measured no valid {bad[0]} ({summary[bad[0]]}) from "
            f"{summary['requests_completed']} completed requests; send more requests{kept}"
        )
    if not math.isfinite(summary["tpot_ms_mean"]):  # every request generated one token
        sys.stderr.write(
            "specsim: note: TPOT is undefined (n/a, null in --json): no request generated more "
            "than one token; raise --max-tokens to measure it\n"
        )
    if failed:
        sys.stderr.write(f"specsim: warning: {len(failed)} requests failed, e.g. {failed[0]}\n")
    return 0


# the numbers a successful run must have measured: finite and non-negative, or it exits 1
HEADLINE = ("duration_s", "throughput_tok_s", "request_throughput", "ttft_ms_mean", "e2e_ms_mean")
