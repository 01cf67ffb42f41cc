"""Measure the real engine's own costs as an SPS profile the simulator reads.

Why not ``specsim profile``'s Hugging Face forward: the simulator must be told what THIS engine's
step costs, and the engine runs its own flattened forward (``target.py``). The step is
decomposed the way the simulator's cost model composes it (``specsim.sim.cost``):

- ``step_ms(B, context)``: one target forward of B new tokens of ONE request after a cached
  context (pure token cost: linear layers grow with B, attention with B x context).
- ``draft_base_ms`` + ``draft_per_request_ms * R``: the proposer drafting R requests, PLUS the
  per-request overhead of verifying R requests instead of one (an attention call per request per
  layer, Python bookkeeping): both are paid once per decoding request per step, which is what the
  simulator charges ``draft_per_request_ms`` for.
- ``sched_base_us`` + ``sched_us_per_request * R``: the policy's decision time.

Every point is the median of ``repeats`` timed runs after a warm-up, so a busy machine disturbs
it less; the CSV header records the torch thread count and the machine load when measured.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from specsim.progress import Progress
from specsim.torch_engine.target import FlatTarget

DEFAULT_B = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384)
DEFAULT_CTX = (64, 256, 512)
DEFAULT_R = (1, 2, 4, 8)


@dataclass(frozen=True, eq=False)
class EngineProfile:
    """The measured profile and the raw points it was fitted from (tidy tables)."""

    cost: Any  # specsim.sim.cost.CostModel
    steps: Any  # DataFrame: context_tokens, batch_tokens, step_ms
    per_request: Any  # DataFrame: requests, draft_ms, verify_extra_ms, sched_us


def _sync(model: Any) -> None:
    """Wait for queued GPU work so that wall-clock timings are real (no-op on CPU)."""
    if next(model.parameters()).is_cuda:
        torch.cuda.synchronize()


def _median_ms(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    fn()  # warm-up
    vals = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        vals.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(vals)


def _ids(gen: np.random.Generator, vocab: int, shape: Any) -> np.ndarray:
    """Random token ids, avoiding the first (special) ids."""
    return gen.integers(min(100, vocab // 2), vocab, shape)


def _fill(ft: FlatTarget, slot: int, ctx: int, gen: np.random.Generator, vocab: int) -> None:
    ft.reset(slot)
    for s in range(0, ctx, 256):
        ft.forward([slot], [_ids(gen, vocab, min(256, ctx - s)).tolist()])


def measure_profile(
    model: Any,
    proposer: Any,
    policy: Any,
    *,
    name: str,
    batch_tokens: tuple[int, ...] = DEFAULT_B,
    contexts: tuple[int, ...] = DEFAULT_CTX,
    requests: tuple[int, ...] = DEFAULT_R,
    draft_context: int = 128,
    repeats: int = 5,
    layout: str = "flat",
    seed: int = 0,
    limits: dict[str, int] | None = None,
) -> EngineProfile:
    """Time the engine's components and return them as a (2-D) :class:`CostModel`."""
    import pandas as pd

    from specsim.policies.base import StepInput
    from specsim.sim.cost import CostModel

    gen = np.random.default_rng(seed)
    vocab = int(model.config.vocab_size)
    r_max = max(requests)
    cap = max(max(contexts), draft_context) + max(batch_tokens) + 16
    ft = FlatTarget(model, max(r_max, 1), cap, proposer.feature_layers, layout)
    rows = []
    total = len(contexts) * len(batch_tokens) + 3 * len(requests)
    with Progress(total, "profile engine", " points") as bar:
        # Interleaved passes: every pass times every (context, B) point once, in a shuffled
        # order, and a point's value is its median over the passes. On a shared machine whose
        # speed drifts, drift then moves all points alike instead of bending the curve.
        # (slot c holds context contexts[c]; slots are filled once)
        slots_ctx = {ctx: i for i, ctx in enumerate(contexts)}
        if len(contexts) > ft.slots:
            ft = FlatTarget(model, len(contexts), cap, proposer.feature_layers, layout)
        for ctx, slot in slots_ctx.items():
            _fill(ft, slot, ctx, gen, vocab)
        points = [(ctx, b) for ctx in contexts for b in batch_tokens]
        toks = {pt: _ids(gen, vocab, pt[1]).tolist() for pt in points}
        times: dict[tuple[int, int], list[float]] = {pt: [] for pt in points}
        for rep in range(repeats + 1):  # pass 0 is a warm-up
            for k in gen.permutation(len(points)):
                ctx, b = points[int(k)]
                slot = slots_ctx[ctx]
                _sync(model)
                t0 = time.perf_counter()
                ft.forward([slot], [toks[(ctx, b)]])
                _sync(model)
                dt = (time.perf_counter() - t0) * 1000.0
                ft.truncate(slot, ctx)
                if rep:
                    times[(ctx, b)].append(dt)
            bar.update(len(points) / (repeats + 1))
        rows = [(ctx, b, statistics.median(times[(ctx, b)])) for ctx, b in points]
        ft = FlatTarget(model, max(r_max, 1), cap, proposer.feature_layers, layout)
        steps = pd.DataFrame(rows, columns=["context_tokens", "batch_tokens", "step_ms"])
        # The table stays jagged: on this CPU a forward of 16 tokens was measured FASTER than
        # one of 12 or 14 (GEMM kernel shapes), and the engine showed the same; smoothing it
        # cost 10% error in a cell. Only the last point is lifted to the one before it, so the
        # simulator's linear extrapolation beyond the table cannot go down (or negative).
        last = steps.groupby("context_tokens")["batch_tokens"].transform("max")
        prev = steps[steps["batch_tokens"] < last].groupby("context_tokens")["step_ms"].last()
        tail = steps["batch_tokens"] == last
        steps.loc[tail, "step_ms"] = np.maximum(
            steps.loc[tail, "step_ms"].to_numpy(),
            steps.loc[tail, "context_tokens"].map(prev).to_numpy(),
        )
        # per-request costs at a typical decode shape: R requests x 4 tokens at draft_context
        for s in range(r_max):
            _fill(ft, s, draft_context, gen, vocab)
        n_feat = max(len(proposer.feature_layers) * int(model.config.hidden_size), 1)
        seq_buf = torch.from_numpy(_ids(gen, vocab, (r_max, cap)))
        feat_buf = torch.randn((r_max, cap, n_feat), dtype=torch.float16)
        g = int(proposer.gamma)
        per = []
        for r in requests:
            slots = np.arange(r)
            anchors = np.full(r, draft_context)
            d_ms = _median_ms(
                lambda slots=slots, anchors=anchors: proposer.propose(
                    slots, anchors, seq_buf, feat_buf, 0.0, None
                ),
                repeats,
            )
            bar.update()
            toks = [_ids(gen, vocab, 4).tolist() for _ in range(r)]

            def many(toks=toks, r=r) -> None:
                ft.forward(list(range(r)), toks)
                _sync(model)
                for s in range(r):
                    ft.truncate(s, draft_context)

            def one(toks=toks) -> None:
                ft.forward([0], [sum(toks, [])])
                _sync(model)
                ft.truncate(0, draft_context)

            extra = _median_ms(many, repeats) - _median_ms(one, repeats)
            bar.update()
            conf = gen.uniform(0.2, 0.95, (r, g))
            lut = CostModel(
                name="tmp",
                batch_tokens=steps["batch_tokens"].unique(),
                step_ms=steps.groupby("batch_tokens")["step_ms"].median().to_numpy(),
            ).step_time_fn(None)
            inp = StepInput(
                conf=conf,
                step_time=lut,
                lagged_conf=conf,
                accept_rate=np.full(g, 0.5),
            )
            s_us = _median_ms(lambda inp=inp: policy.schedule(inp), max(repeats, 20)) * 1000.0
            bar.update()
            per.append((r, d_ms, extra, s_us))
    per_req = pd.DataFrame(per, columns=["requests", "draft_ms", "verify_extra_ms", "sched_us"])
    rr = per_req["requests"].to_numpy(np.float64)
    d_slope, d_base = np.polyfit(rr, per_req["draft_ms"].to_numpy(), 1)
    v_slope = float(np.polyfit(rr - 1.0, per_req["verify_extra_ms"].to_numpy(), 1)[0])
    s_slope, s_base = np.polyfit(rr, per_req["sched_us"].to_numpy(), 1)
    # the engine loop's own overhead (admission, building the batch, accepting, streaming,
    # splitting attention per request), measured by running the engine itself on random prompts
    table_only = _table_cost(steps)
    over = _loop_overhead(model, proposer, table_only, requests, layout, gen, vocab)
    per_req = per_req.merge(over, on="requests")
    o_slope, o_base = np.polyfit(rr, per_req["loop_overhead_ms"].to_numpy(), 1)
    piv = steps.pivot_table(index="context_tokens", columns="batch_tokens", values="step_ms")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    meta = {
        "source": "measured by specsim.torch_engine.profile (the real engine's own forward)",
        "measured_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "torch_threads": str(torch.get_num_threads()),
        "loadavg_1min": f"{load:.2f}",
        "layout": layout,
        "draft_context": str(draft_context),
        "draft_per_request_ms_drafting": f"{max(d_slope, 0.0):.4f}",
        "draft_per_request_ms_verify_split": f"{max(v_slope, 0.0):.4f}",
        "draft_base_ms_loop": f"{o_base:.4f}",
        "draft_per_request_ms_loop": f"{o_slope:.4f}",
        "repeats": str(repeats),
    }
    lim = limits or {}
    cost = CostModel(
        name=name,
        batch_tokens=piv.columns.to_numpy(np.int64),
        step_ms=piv.to_numpy(np.float64) if len(piv) > 1 else piv.to_numpy(np.float64)[0],
        context_tokens=piv.index.to_numpy(np.float64) if len(piv) > 1 else None,
        draft_base_ms=round(float(max(d_base + o_base, 0.0)), 4),
        draft_per_request_ms=round(float(max(d_slope + o_slope, 0.0)), 4),
        sched_base_us=round(float(max(s_base, 0.0)), 2),
        sched_us_per_request=round(float(max(s_slope, 0.0)), 3),
        max_running=int(lim.get("max_running", 256)),
        kv_tokens=int(lim.get("kv_tokens", 1 << 20)),
        prefill_budget=int(lim.get("prefill_budget", 16384)),
        meta=meta,
    )
    return EngineProfile(cost=cost, steps=steps, per_request=per_req)


def _table_cost(steps: Any) -> Any:
    """A CostModel of the step table alone (no draft, no scheduler costs)."""
    from specsim.sim.cost import CostModel

    piv = steps.pivot_table(index="context_tokens", columns="batch_tokens", values="step_ms")
    return CostModel(
        name="table",
        batch_tokens=piv.columns.to_numpy(np.int64),
        step_ms=piv.to_numpy(np.float64) if len(piv) > 1 else piv.to_numpy(np.float64)[0],
        context_tokens=piv.index.to_numpy(np.float64) if len(piv) > 1 else None,
    )


def _loop_overhead(
    model: Any,
    proposer: Any,
    table: Any,
    requests: tuple[int, ...],
    layout: str,
    gen: np.random.Generator,
    vocab: int,
    prompt: int = 32,
    out: int = 16,
) -> Any:
    """Median per-step time the engine spends outside the target forward's table cost, the
    drafting and the policy, at R decoding requests (``static:3``: 4 tokens each)."""
    import pandas as pd

    from specsim.policies.base import get_policy
    from specsim.sim.workload import Workload
    from specsim.torch_engine.engine import EngineConfig, RealEngine

    rows = []
    for r in requests:
        prompts = [_ids(gen, vocab, prompt).tolist() for _ in range(r)]
        wl = Workload(
            kind="closed",
            describe="calibration",
            arrival_s=None,
            trace_idx=np.arange(r),
            prompt_len=np.full(r, prompt),
            output_len=np.full(r, out),
            concurrency=r,
            max_jobs=r,
        )
        res = RealEngine(
            model,
            proposer,
            get_policy("static:3"),
            table,
            prompts,
            wl,
            EngineConfig(max_running=r, layout=layout, warmup_steps=1),
        ).run()
        st = res.steps
        st = st[(st["prefilling"] == 0) & (st["decoding"] == r)]
        pred = np.array(
            [
                table.step_time(int(b), float(c))
                for b, c in zip(st["batch_tokens"], st["ctx_mean"], strict=True)
            ]
        )
        resid = st["duration_s"].to_numpy() - st["draft_s"] - st["sched_s"] - pred
        rows.append((r, float(np.median(resid)) * 1000.0 if len(st) else 0.0))
    return pd.DataFrame(rows, columns=["requests", "loop_overhead_ms"])


def probe_ms(model: Any, points: tuple[tuple[int, int], ...], repeats: int = 3, seed: int = 1):
    """Median ms of single-request forwards at (context, batch) points: re-timed during a long
    validation to see how much faster or slower the (shared) machine is than at profiling."""
    gen = np.random.default_rng(seed)
    vocab = int(model.config.vocab_size)
    cap = max(c for c, _ in points) + max(b for _, b in points) + 1
    ft = FlatTarget(model, 1, cap)
    out = []
    for ctx, b in points:
        _fill(ft, 0, ctx, gen, vocab)
        toks = _ids(gen, vocab, b).tolist()

        def step(toks=toks, ctx=ctx) -> None:
            ft.forward([0], [toks])
            ft.truncate(0, ctx)
            _sync(model)

        out.append(_median_ms(step, repeats))
    return out


def compare_layouts(
    model: Any,
    lens: tuple[int, ...] = (1, 3, 5, 8, 2, 6, 1, 4),
    context: int = 128,
    repeats: int = 5,
    seed: int = 0,
) -> dict[str, float]:
    """Median ms of one verification forward of requests verifying ``lens`` tokens each, flat
    against padded (same model, same cache contents)."""
    gen = np.random.default_rng(seed)
    vocab = int(model.config.vocab_size)
    out = {}
    for layout in ("flat", "padded"):
        ft = FlatTarget(model, len(lens), context + max(lens) + 1, (), layout)
        for s in range(len(lens)):
            _fill(ft, s, context, gen, vocab)
        toks = [_ids(gen, vocab, n).tolist() for n in lens]

        def step(ft=ft, toks=toks) -> None:
            ft.forward(list(range(len(toks))), toks)
            _sync(model)
            for s in range(len(toks)):
                ft.truncate(s, context)

        out[layout] = _median_ms(step, repeats)
    out["tokens"] = float(sum(lens))
    out["requests"] = float(len(lens))
    out["padded_rows"] = float(len(lens) * max(lens))
    return out
