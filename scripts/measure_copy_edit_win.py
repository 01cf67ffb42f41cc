"""Issue 66, part 1: does speculation pay on llama-server for the copy-edit workload?

Why: on every earlier llama-server grid speculation lost to the plain server (reports/
llama-cpp-held-out: all 24 cells), so specsim has never been checked where speculation wins on
a real engine. ``copy-edit`` (prompts whose answers copy or lightly edit a passage the prompt
holds) is built so that a drafter can guess long runs; this script measures, before any grid
is defined, whether it does and by how much, at one request in flight and under load.

The rule (reports/llama-cpp-v4/PLAN.md, committed before the first run; the first result is
kept): one plain server measures each prompt's greedy length (to EOS, at most --max-tokens);
then for each setting one server (the fidelity grid's flags: ``-np`` --parallel, ``-t 1
--threads-batch 1``) takes a closed loop at each concurrency, token-id prompts, ``ignore_eos``
and those lengths, temperature 0; one run per (setting, concurrency). Gain = the setting's
output tokens per wall second over ``none``'s at the same concurrency, minus 1.

    python scripts/measure_copy_edit_win.py --out reports/llama-cpp-v4/win.csv  # a quiet machine
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

from specsim.fidelity.llama.config import LlamaValidationConfig, SpecSetting
from specsim.fidelity.llama.servers import send, start_server
from specsim.fidelity.llama.traces import natural_lengths
from specsim.prompts import load_prompts
from specsim.serve.llama_tokens import chat_prompt_ids

SETTINGS = ("none", "ngram:3", "ngram:7", "dspark:7", "dspark:7:0.3")
LOADS = {1: "copy-edit[0:16]", 4: "copy-edit[0:32]"}  # concurrency: the prompts it sends


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="CSV to write (refused if present)")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="llama-server -t")
    ap.add_argument("--threads-batch", type=int, default=1, help="llama-server --threads-batch")
    ap.add_argument("--target-type", default="Q4_1", help="the target's weights (requant.TYPES)")
    ap.add_argument("--settings", default=",".join(SETTINGS), help="none first, comma-separated")
    args = ap.parse_args()
    settings = tuple(args.settings.split(","))
    if settings[0] != "none":
        print("error: --settings must start with none (the gains are over it)", file=sys.stderr)
        return 2
    if args.out.exists():
        print(f"error: {args.out} exists; move it away (the first result is kept)", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    cfg = LlamaValidationConfig(
        prompts=("copy-edit",), specs=settings, concurrency=tuple(LOADS), parallel=max(LOADS),
        calib_concurrency=tuple(LOADS), temperatures=(0.0,), max_tokens=args.max_tokens,
        threads=args.threads, threads_batch=args.threads_batch, seed=args.seed, out=args.out.parent,
        target_type=args.target_type,
    )  # fmt: skip
    texts = {c: [p.text for p in load_prompts(spec)] for c, spec in LOADS.items()}
    widest = max(texts.values(), key=len)
    t0 = time.monotonic()
    with start_server(cfg, SpecSetting("none")) as srv:
        ids = chat_prompt_ids(srv, widest)
        lengths = natural_lengths(srv, ids, cfg)
    print(f"lengths of {len(ids)} prompts: mean {sum(lengths) / len(lengths):.1f} tokens, "
          f"prompt mean {sum(map(len, ids)) / len(ids):.0f} ({time.monotonic() - t0:.0f} s)",
          flush=True)  # fmt: skip
    rows = []
    for text in settings:
        setting = SpecSetting.parse(text)
        with start_server(cfg, setting) as srv:
            for c, prompts in texts.items():
                n = len(prompts)
                t1 = time.monotonic()
                _, res, s = send(srv, ids[:n], lengths[:n], temperature=0.0, seed=args.seed,
                                 concurrency=c, requests=n)  # fmt: skip
                row = {
                    "setting": text, "target_type": args.target_type, "threads": args.threads,
                    "threads_batch": args.threads_batch, "concurrency": c,
                    "requests": n,
                    "failed": s["requests_failed"], "output_tokens": s["output_tokens"],
                    "throughput_tok_s": s["throughput_tok_s"], "tpot_ms_mean": s["tpot_ms_mean"],
                    "ttft_ms_mean": s["ttft_ms_mean"],
                    "draft_tokens": s.get("draft_tokens", 0),
                    "accepted_draft_tokens": s.get("accepted_draft_tokens", 0),
                    "accept_per_draft": s.get("verify_efficiency", float("nan")),
                    "wall_s": time.monotonic() - t1,
                }  # fmt: skip
                rows.append(row)
                print(f"{text:>12} C={c}: {row['throughput_tok_s']:.1f} tok/s, TPOT "
                      f"{row['tpot_ms_mean']:.1f} ms, accept/draft "
                      f"{row['accept_per_draft']:.3f} ({row['wall_s']:.0f} s)",
                      flush=True)  # fmt: skip
    table = pd.DataFrame(rows)
    base = table[table.setting == "none"].set_index("concurrency")
    table["gain_vs_none"] = [
        r.throughput_tok_s / base.loc[r.concurrency, "throughput_tok_s"] - 1
        for r in table.itertuples()
    ]
    table["tpot_vs_none"] = [
        r.tpot_ms_mean / base.loc[r.concurrency, "tpot_ms_mean"] for r in table.itertuples()
    ]
    tmp = args.out.with_suffix(".tmp")
    table.to_csv(tmp, index=False, float_format="%.4f")
    tmp.rename(args.out)
    print(table.to_string(index=False))
    print(f"wrote {args.out} ({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
