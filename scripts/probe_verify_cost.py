"""Issue 66, part 1: what a verify of k tokens costs llama-server beside a one-token decode, per
target weight type.

Why: on the shipped Q4_1 target every speculative setting at best drew level with the plain
server although the n-grams accepted half to two thirds of their drafts (reports/llama-cpp-v4/
PLAN.md, steps 1-1c): on a CPU a batch of k + 1 tokens costs about k + 1 decodes when the
weight type has no batched kernel. This measures that curve on the same weights as Q4_1, Q8_0
and Q4_0 (:mod:`specsim.record.requant`), so the next win measurement's target is chosen for a
reason, before it runs.

Method: one plain server per type and prefix (``-np 1 -t T --threads-batch T``); a prefix of
random tokens (--prefixes, 200 by default) is evaluated once and cached; then, interleaved
over k, requests send the prefix plus k fresh
random tokens with ``n_predict`` 1, and the server's own ``timings.prompt_ms`` for those k
tokens is the batch's cost (its median over --repeats); a 64-token ``ignore_eos`` completion
gives the one-token decode (``predicted_ms`` per token).

    python scripts/probe_verify_cost.py --out reports/llama-cpp-v4/verify-cost.csv  # quiet machine
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from specsim.fidelity.llama.config import LlamaValidationConfig, SpecSetting
from specsim.fidelity.llama.servers import start_server
from specsim.record.requant import TYPES

KS = (1, 2, 3, 4, 6, 8, 12, 16)
PREFIX = 200


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="CSV to write (refused if present)")
    ap.add_argument("--threads", type=int, default=2, help="-t and --threads-batch")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--prefixes", default=str(PREFIX), help="cached prefix lengths, a,b,...")
    args = ap.parse_args()
    if args.out.exists():
        print(f"error: {args.out} exists; move it away (the first result is kept)", file=sys.stderr)
        return 2
    rng = np.random.default_rng(0)
    rows = []
    t0 = time.monotonic()
    cases = [(q, int(n)) for q in args.types.split(",") for n in args.prefixes.split(",")]
    for qtype, plen in cases:
        prefix = [int(t) for t in rng.integers(1000, 20000, plen)]
        cfg = LlamaValidationConfig(
            concurrency=(1,), calib_concurrency=(1,), parallel=1, threads=args.threads,
            threads_batch=args.threads, target_type=qtype,
        )  # fmt: skip
        with start_server(cfg, SpecSetting("none")) as srv:
            base = {"cache_prompt": True, "temperature": 0.0}
            srv.completion({**base, "prompt": prefix, "n_predict": 1})
            cost: dict[int, list[float]] = {k: [] for k in KS}
            for _ in range(args.repeats):
                for k in KS:
                    extra = [int(t) for t in rng.integers(1000, 20000, k)]
                    r = srv.completion({**base, "prompt": prefix + extra, "n_predict": 1})
                    if r["timings"]["prompt_n"] != k:
                        print(f"error: server evaluated {r['timings']['prompt_n']} tokens, not {k} "
                              "(the prefix was not reused)", file=sys.stderr)  # fmt: skip
                        return 1
                    cost[k].append(r["timings"]["prompt_ms"])
            dec = srv.completion({**base, "prompt": prefix, "n_predict": 64, "ignore_eos": True})
            decode_ms = dec["timings"]["predicted_ms"] / dec["timings"]["predicted_n"]
        for k in KS:
            ms = statistics.median(cost[k])
            rows.append({"target_type": qtype, "threads": args.threads, "prefix": plen, "k": k,
                         "batch_ms": ms, "decode_ms": decode_ms,
                         "batch_over_decode": ms / decode_ms})  # fmt: skip
        print(f"{qtype} after {plen}: decode {decode_ms:.2f} ms; batch of 1/4/8/16: "
              + " / ".join(f"{statistics.median(cost[k]):.1f}" for k in (1, 4, 8, 16))
              + f" ms ({time.monotonic() - t0:.0f} s)", flush=True)  # fmt: skip
    table = pd.DataFrame(rows)
    tmp = args.out.with_suffix(".tmp")
    table.to_csv(tmp, index=False, float_format="%.4f")
    tmp.rename(args.out)
    print(table.to_string(index=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
