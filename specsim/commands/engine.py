"""``specsim engine``: serve prompts with the real speculative engine (torch), log every step.

Writes under ``--out``: ``summary.json``, ``requests.parquet`` (TTFT, TPOT, per-user tok/s per
request), ``steps.parquet`` (per step: time, B, accepted, the simulator's columns plus the
breakdown draft/sched/verify/accept on the engine's clock, ``--clock wall``, ``cpu`` or ``ref``),
``tokens.parquet`` (streamed emissions) and ``outputs.jsonl`` (generated text per request).
torch is imported inside ``run`` only.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specsim.commands.common import DRAFTER_HELP, POLICY_HELP, add_seed, add_threads
from specsim.errors import SpecsimError
from specsim.outputs import atomic as atomic_path


def add_model_args(p: argparse.ArgumentParser, drafter: bool = True) -> None:
    """Target, drafter, device, threads and layout (shared with ``specsim validate``, which
    takes ``--drafters`` instead of ``--drafter``)."""
    p.add_argument("--target", default="smollm2", help="'smollm2', a .gguf file or an HF dir")
    if drafter:
        p.add_argument(
            "--drafter",
            default="dspark",
            help=DRAFTER_HELP + ", or 'init' (an untrained DSpark drafter) (default: dspark)",
        )
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    add_threads(p)
    p.add_argument(
        "--layout",
        default="flat",
        choices=("flat", "padded"),
        help="verification batch layout (default: flat, measured faster)",
    )
    p.add_argument(
        "--clock",
        default="wall",
        choices=("wall", "cpu", "ref"),
        help="the engine's time axis: wall time; cpu, a virtual clock of the thread's CPU time "
        "(what a dedicated core would show on a shared machine); ref, that CPU time at the "
        "speed the core had at the start, re-timed by probes every few seconds (for a VM whose "
        "core speed drifts); cpu and ref need --threads 1 and cpu (default: wall)",
    )
    add_seed(p)


def set_threads(n: int) -> None:
    from specsim.record.models import set_threads as _set

    _set(n)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("engine", help="run the real batched speculative-decoding engine")
    add_model_args(p)
    p.add_argument(
        "--prompts",
        nargs="+",
        required=True,
        help="prompt sets, e.g. humaneval[:8] gsm8k[:8] or a JSONL file",
    )
    p.add_argument("--policy", default="hw-aware", help=POLICY_HELP + " (default: hw-aware)")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=int, help="closed loop at C concurrent requests")
    load.add_argument("--rate", type=float, help="open loop, Poisson arrivals at RATE req/s")
    p.add_argument("--requests", type=int, default=None, help="jobs to run (default: one each)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument(
        "--profile",
        default=None,
        help="SPS profile (name or CSV) for the policy's step_time (default: measure "
        "this engine's own, ~1 min)",
    )
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--force", action="store_true", help="overwrite files in --out")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.max_new_tokens < 1:
        raise SpecsimError("--max-new-tokens must be at least 1")
    names = ("summary.json", "requests.parquet", "steps.parquet", "tokens.parquet", "outputs.jsonl")
    clash = [n for n in names if (args.out / n).exists()]
    if clash and not args.force:
        raise SpecsimError(f"{args.out / clash[0]} exists; pass --force to overwrite it")
    from specsim.policies.base import get_policy

    policy = get_policy(args.policy)
    from specsim.torch_engine.clock import check_clock

    check_clock(args.clock, args.device, args.threads)
    set_threads(args.threads)
    from specsim.progress import Progress
    from specsim.prompts import load_many
    from specsim.record.models import load_target, prompt_ids
    from specsim.sim.cost.profiles import get_profile
    from specsim.sim.workload import TraceLengths, synthetic
    from specsim.torch_engine.engine import EngineConfig, RealEngine
    from specsim.torch_engine.proposers import make_proposer

    prompts = load_many(args.prompts)
    target = load_target(args.target, args.device)
    proposer, drafter_name = make_proposer(args.drafter, target)
    ids = [prompt_ids(target.tokenizer, p.text) for p in prompts]
    if args.profile:
        cost = get_profile(args.profile)
    else:
        from specsim.torch_engine.cost_calibration import measure_profile

        cost = measure_profile(
            target.model,
            proposer,
            get_policy("hw-aware"),
            name="engine-measured",
            batch_tokens=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            contexts=(64, 256),
            repeats=3,
            layout=args.layout,
            clock=args.clock,
        ).cost
    lengths = TraceLengths([len(i) for i in ids], [args.max_new_tokens] * len(ids))
    if args.concurrency is not None:
        wl = synthetic(
            lengths, concurrency=args.concurrency, requests=args.requests, seed=args.seed
        )
    else:
        wl = synthetic(lengths, rate=args.rate or 1.0, requests=args.requests, seed=args.seed)
    cfg = EngineConfig(
        temperature=args.temperature,
        seed=args.seed,
        layout=args.layout,
        max_running=int(args.concurrency or cost.max_running),
        kv_tokens=cost.kv_tokens,
        prefill_budget=cost.prefill_budget,
        eos_ids=tuple(target.eos_ids),
        clock=args.clock,
    )
    n_jobs = wl.n_jobs_hint()
    with Progress(n_jobs, f"engine {policy.name}", " requests") as bar:
        res = RealEngine(target.model, proposer, policy, cost, ids, wl, cfg, progress=bar).run()
    args.out.mkdir(parents=True, exist_ok=True)

    def atomic(name: str, write) -> None:  # type: ignore[no-untyped-def]
        with atomic_path(args.out / name) as tmp:
            write(tmp)

    summary = {**res.summary, **res.config, "drafter": drafter_name, "target": target.name}
    atomic("summary.json", lambda p: p.write_text(json.dumps(summary, indent=2) + "\n"))
    atomic("requests.parquet", lambda p: res.requests.to_parquet(p, index=False))
    atomic("steps.parquet", lambda p: res.steps.to_parquet(p, index=False))
    atomic("tokens.parquet", lambda p: res.tokens.to_parquet(p, index=False))

    def outputs(p: Path) -> None:
        with open(p, "w", encoding="utf-8") as fh:
            for j, toks in enumerate(res.outputs):
                t = int(res.raw.job_trace[j])
                fh.write(
                    json.dumps(
                        {
                            "job": j,
                            "prompt": prompts[t].source,
                            "tokens": toks,
                            "text": target.tokenizer.decode(toks),
                        }
                    )
                    + "\n"
                )

    atomic("outputs.jsonl", outputs)
    keys = (
        "requests_completed",
        "output_tokens",
        "throughput_tok_s",
        "tpot_ms_mean",
        "ttft_ms_mean",
        "tau",
        "per_user_tps_mean",
        "mean_batch_tokens",
    )
    print(json.dumps({k: summary[k] for k in keys}))
    return 0
