"""``specsim profile build`` and ``profile fit``: the deployment's flags (shared), the build's
printout and file; fit's own work is in :mod:`specsim.commands.profile_fit`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specsim.commands.profile_args import _degree, _deployment, _engine_limit


def add_build_args(acts: argparse._SubParsersAction) -> None:
    """``profile build``: a deployment's profile from measured operator curves."""
    b = acts.add_parser(
        "build",
        help="price a deployment from measured operator times (Vidur's H100/A100 tables, "
        "carried to other GPUs) and write a profile CSV",
        description="Every term of a step priced on measured operator curves for the model's "
        "shapes; assumed facts (engine overheads, sampling passes, activation reserve) are "
        "printed with a low-high range. docs/simulator.md, 'Build a profile for your "
        "deployment'.",
    )
    _deployment_args(b)
    b.add_argument("--out", type=Path, help="profile CSV to write (default: print only)")
    b.add_argument("--force", action="store_true", help="overwrite --out")
    b.set_defaults(func=run_build)

    f = acts.add_parser(
        "fit",
        help="anchor a built profile on your own benchmark runs without speculation (two or "
        "more concurrencies) and write it",
        description="The deployment as profile build takes it, plus --baseline: vllm bench "
        "serve --save-result JSON, sglang.bench_serving JSONL, trtllm-bench --streaming "
        "--report_json JSON, specsim bench --json output, or a CSV (concurrency, prompt_tokens, "
        "output_tokens, output_tok_s, mean_tpot_ms). The "
        "built profile's GPU time, fixed step cost and per-request cost are fitted to the runs' "
        "TPOT; the drafter stays as built. Instead of the deployment, --profile anchors any "
        "profile (measured, imported or built). docs/vllm.md, 'Anchor on your baseline'.",
    )
    _deployment_args(f, model_required=False)
    f.add_argument("--profile", metavar="PROFILE", help="instead of --model and the "
                   "deployment: a profile to anchor (a shipped name or a CSV: measured by "
                   "specsim profile, imported from an engine, or built)")  # fmt: skip
    f.add_argument("--baseline", type=Path, nargs="+", required=True, metavar="FILE",
                   help="benchmark results without speculation, one run a file (JSONL / CSV: "
                   "one a line)")  # fmt: skip
    f.add_argument("--out", type=Path, required=True, help="profile CSV to write")
    f.add_argument("--force", action="store_true", help="overwrite --out")
    f.set_defaults(func=_run_fit)


def _run_fit(args: argparse.Namespace) -> int:
    from specsim.commands.profile_fit import run_fit

    return run_fit(args)


def _deployment_args(b: argparse.ArgumentParser, model_required: bool = True) -> None:
    """The deployment's flags, shared by ``profile build`` and ``profile fit``."""
    b.add_argument("--model", required=model_required, help="a built-in model name (or its HF "
                   "repo id, e.g. meta-llama/Llama-3.3-70B-Instruct) or a HF config.json"
                   + ("" if model_required else "; or give --profile"))  # fmt: skip
    b.add_argument("--gpu", default="H100", help="H100, H200, H20, H800, B200, B300, GB200, "
                   "GB300, MI300X, MI355X or A100, the SXM/OAM parts (default H100)")  # fmt: skip
    for key in ("tp", "ep", "dp"):
        b.add_argument(f"--{key}", type=_degree, default=1,
                       help=f"{key.upper()} degree, 1 to 1024")  # fmt: skip
    b.add_argument("--weight-dtype", choices=("bf16", "fp16", "fp8", "fp4"),
                   help="weights' precision (default: the checkpoint's)")  # fmt: skip
    b.add_argument("--kv-dtype", choices=("bf16", "fp16", "fp8"), default="bf16")
    b.add_argument("--engine", choices=("vllm", "sglang", "trtllm"), default="vllm")
    b.add_argument("--drafter", default="none",
                   help="none, ngram, mtp:K, dspark:layers=5,width=4096,block=7, or "
                   "eagle3:layers=1,steps=3,topk=1,draft_tokens=4 (eagle1: the same "
                   "keys)")  # fmt: skip
    b.add_argument("--capture", type=_engine_limit, default=0, metavar="N",
                   help="the engine's CUDA-graph capture limit, in its unit: vLLM's "
                   "max_cudagraph_capture_size (tokens), SGLang's --cuda-graph-max-bs "
                   "(requests), TensorRT-LLM tokens (default: the engine's rule for this GPU "
                   "and draft length, printed)")  # fmt: skip
    b.add_argument("--graph-mode", default="", metavar="MODE",
                   choices=("", "full_and_piecewise", "piecewise", "full_decode_only", "none"),
                   help="what a captured step replays: full_and_piecewise (vLLM v1's "
                   "default: prefill and mixed steps piecewise, attention eager), piecewise, "
                   "full_decode_only (prefill and mixed steps eager; SGLang's and "
                   "TensorRT-LLM's assumed default) or none (--enforce-eager)")  # fmt: skip
    b.add_argument("--max-num-seqs", type=_engine_limit, default=0, metavar="N",
                   help="requests running at once per DP rank (default 256)")  # fmt: skip
    b.add_argument("--max-num-batched-tokens", type=_engine_limit, default=0, metavar="N",
                   help="tokens one step may hold per DP rank (default 8192)")  # fmt: skip
    b.add_argument("--assume", choices=("low", "mid", "high", "against", "favour"),
                   default="mid",
                   help="where each assumed term is written in its range (mid); against / "
                   "favour: at the end that lowers / raises the gain of speculation, the two "
                   "profiles whose gains bound the printed range")  # fmt: skip


def run_build(args: argparse.Namespace) -> int:
    from specsim.sim.cost.build_profile import bill

    dep = _deployment(args)
    if args.out is None:
        print(bill(dep)[1])
        return 0
    from specsim.outputs import claim
    from specsim.sim.cost.profile_csv import write_profile_csv

    with claim(args.out, force=args.force, suffixes=(".csv",)) as out:
        model, text = bill(dep)
        write_profile_csv(model, out, force=True)
    print(text)
    print(f"wrote {out}; replay with --profile {out} (what the assumptions move: build again "
          "with --assume low and high, or against and favour for a gain, and add --spread "
          "LOW.csv,HIGH.csv to replay)", file=sys.stderr)  # fmt: skip
    return 0


__all__ = ["add_build_args", "run_build"]
