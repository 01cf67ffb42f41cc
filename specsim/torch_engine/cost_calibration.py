"""Measure the real engine's own costs as an SPS profile the simulator reads.

Why not ``specsim profile``'s Hugging Face forward: the simulator must be told what THIS engine's
step costs, and the engine runs its own flattened forward (``target.py``). The step is
decomposed the way the simulator's cost model composes it (``specsim.sim.cost.model``):

- ``step_ms(B, context)``: one target forward of B new tokens of ONE request after a cached
  context, logits on every row (a verified token's cost: linear layers and LM head grow with B,
  attention with B x context).
- ``prefill_token_ms``: a prompt token (its forward without the LM head, which runs on the
  prompt's last token only), fitted from prefills of 32-256 tokens on top of the table's B = 1.
- ``draft_base_ms + R * (draft_per_request_ms + gamma * draft_per_token_ms)
  + draft_per_context_us * sum_r min(context_r, window)``: the proposer drafting R requests; the
  context term is what a DSpark drafter's attention over up to ``context_window`` target
  features costs, the per-token term the sequential heads (timed by drafting shorter blocks).
  ``draft_curve`` replaces ``draft_base_ms + R * draft_per_request_ms`` with the engine's own
  drafting at each R (its draft timer while running random prompts, less the context and
  per-token terms): drafting grows faster than linearly in R, and the straight line charged
  13-20% too little at 4-16 requests. The line stays in the header (the term ablation).
- ``overhead_curve``: what the engine loop spends per step outside the table, drafting and
  scheduling (one attention call per request per layer, accepting, streaming, cache
  bookkeeping) at each R: the forward's per-request split (R requests against one request of
  the same tokens, alternating pairs) plus the loop's own timers in the engine run on random
  prompts, kept as
  points (linear between them): it is ~0 at 1-2 requests and ~4.5 ms a request from 4 on, which
  the old ``step_overhead_ms + verify_per_request_ms * R`` line could not follow (its fit stays
  in the header's ``overhead_linear_fit``).
- ``sched_base_us`` + ``sched_us_per_request * R``: the policy's decision time.

Every call is timed on two clocks at once: the thread's CPU time (at the speed reference's
speed with ``clock="ref"``, ``specsim.torch_engine.clock``) and the wall clock. The
profile of the requested clock is fitted from its own timings; the other clock's step table is
fitted from its own timings too, its scalar terms are the requested clock's scaled by the
median wall/CPU ratio of the table points (on a quiet machine ~1.0). Every point is the median
of ``repeats`` timed runs after a warm-up; the CSV header records the clock, the torch thread
count and the machine load when measured.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from specsim.errors import SpecsimError
from specsim.progress import Progress
from specsim.torch_engine.clock import active_reference, use_reference
from specsim.torch_engine.overhead import _loop_overhead
from specsim.torch_engine.speed import _fill, _ids, _sync, speed_reference
from specsim.torch_engine.target import FlatTarget
from specsim.torch_engine.timing import (
    _anchor_scaled,
    _median2,
    _paired_diff,
    _timed,
)

DEFAULT_B = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384)
DEFAULT_CTX = (64, 256, 512)
DEFAULT_R = (1, 2, 4, 8)
DEFAULT_P = (32, 64, 128, 256)  # prompt tokens of the timed prefills
# Decode points of up to SMALL_B tokens are timed SMALL_PAIRS times a pass: a pair's ratio still
# scatters by several percent on this VM, these calls are cheap (~60-130 ms), and the steps of
# low load and of goodput-style policies sit there (studies/bench_profile_table.py)
SMALL_B, SMALL_PAIRS = 16, 3


@dataclass(frozen=True, eq=False)
class EngineProfile:
    """The measured profile and the raw points it was fitted from (tidy tables)."""

    cost: Any  # specsim.sim.cost.model.CostModel, on the requested clock
    steps: Any  # DataFrame: context_tokens, batch_tokens, step_ms, step_ms_wall, step_ms_cpu
    per_request: Any  # DataFrame: requests, draft_ms, verify_extra_ms, sched_us
    other: Any = None  # the same profile on the other clock (wall if cost is cpu, and back)
    terms: Any = None  # DataFrame of the draft-context, block and prefill timing points
    prefill_points: Any = None  # [(prompt tokens, cpu ms, wall ms)]: the prefills (reusable)


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
    prefill_tokens: tuple[int, ...] = DEFAULT_P,
    repeats: int = 5,
    layout: str = "flat",
    seed: int = 0,
    limits: dict[str, int] | None = None,
    clock: str = "wall",
    draft_phase: str = "draft",
    table: EngineProfile | None = None,
    table_repeats: int | None = None,
) -> EngineProfile:
    """Time the engine's components and return them as a (2-D) :class:`CostModel` on ``clock``
    (and the same on the other clock as ``EngineProfile.other``). ``clock="ref"`` uses the
    process's speed reference (:func:`~specsim.torch_engine.clock.use_reference`; one of its
    own if none is set), drafting timed against its ``draft_phase`` probe.

    ``table``: an earlier profile of the same target, clock and points whose step table and
    prefill points are reused instead of timed again (the target's forward does not depend on
    the drafter: a grid of two drafters can time one table with the passes of both; at B = 128
    3 passes left 9-13% between profiles, 9 passes 3-9%, studies/README.md).
    ``table_repeats``: the table's passes (default ``repeats``)."""
    if table is not None:
        have = table.steps
        same = (
            sorted(set(have["context_tokens"])) == sorted(contexts)
            and sorted(set(have["batch_tokens"])) == sorted(batch_tokens)
            and table.prefill_points is not None
            and [p for p, *_ in table.prefill_points] == list(prefill_tokens)
            and table.cost.meta.get("clock") == clock
        )
        if not same:
            raise SpecsimError(
                "a reused profile table must have the same contexts, batch tokens, prefill "
                "points and clock; measure the table again instead"
            )
    from specsim.torch_engine.clock import check_clock

    check_clock(clock)
    ci = 0 if clock != "wall" else 1  # index of the requested clock in (cpu, wall) pairs
    own_ref = clock == "ref" and active_reference() is None
    if own_ref:  # a reference of this profile's own, taken now
        use_reference(speed_reference(model, {draft_phase: proposer}))
    try:
        return _measure(
            model, proposer, policy, name, batch_tokens, contexts, requests, draft_context,
            prefill_tokens, repeats, layout, seed, limits, clock, draft_phase, ci, table,
            table_repeats or repeats,
        )  # fmt: skip
    finally:
        if own_ref:
            use_reference(None)


def _measure(  # type: ignore[no-untyped-def]
    model, proposer, policy, name, batch_tokens, contexts, requests, draft_context,
    prefill_tokens, repeats, layout, seed, limits, clock, draft_phase, ci, table, table_repeats,
) -> EngineProfile:  # fmt: skip
    import pandas as pd

    from specsim.policies.base import StepInput
    from specsim.sim.cost.model import CostModel

    gen = np.random.default_rng(seed)
    vocab = int(model.config.vocab_size)
    r_max = max(requests)
    drafter = getattr(proposer, "drafter", None)  # DSpark: attends to a window of features
    window = int(drafter.cfg.context_window) if drafter is not None else 0
    d_ctxs = _draft_contexts(draft_context, window)
    cap = max(max(contexts), draft_context, max(d_ctxs), max(prefill_tokens)) + max(batch_tokens)
    cap += 16
    total = 0 if table is not None else len(contexts) * len(batch_tokens) + len(prefill_tokens)
    total += 3 * len(requests) + len(d_ctxs) + 2
    with Progress(total, f"profile engine ({clock} clock)", " points") as bar:
        if table is None:
            steps, pre_pts = _time_table(
                model, proposer, contexts, batch_tokens, prefill_tokens, cap, layout, gen, vocab,
                table_repeats, ci, bar,
            )  # fmt: skip
        else:  # the table of an earlier profile of the same target (see measure_profile)
            steps = table.steps.copy()
            pre_pts = list(table.prefill_points)
        ft = FlatTarget(model, max(r_max, 1), cap, proposer.feature_layers, layout)
        # The table stays jagged: on this CPU a forward of 16 tokens was measured FASTER than
        # one of 12 or 14 (GEMM kernel shapes), and the engine showed the same; smoothing it
        # cost 10% error in a cell. Only the last point is lifted to the one before it, so the
        # simulator's linear extrapolation beyond the table cannot go down (or negative).
        for col in ("step_ms", "step_ms_cpu", "step_ms_wall"):
            _lift_tail(steps, col)
        # per-request costs at a typical decode shape: R requests x 4 tokens at draft_context
        for s in range(r_max):
            _fill(ft, s, max(draft_context, max(d_ctxs)), gen, vocab)
        n_feat = max(len(proposer.feature_layers) * int(model.config.hidden_size), 1)
        seq_buf = torch.from_numpy(_ids(gen, vocab, (r_max, cap)))
        feat_buf = torch.randn((r_max, cap, n_feat), dtype=torch.float16)
        g = int(proposer.gamma)

        def drafting(r: int, ctx: int, gamma: int = g):  # type: ignore[no-untyped-def]
            slots, anchors = np.arange(r), np.full(r, ctx)

            def call() -> None:
                old = proposer.gamma
                proposer.gamma = gamma  # a shorter block: fewer sequential head steps
                try:
                    proposer.propose(slots, anchors, seq_buf, feat_buf, 0.0, None)
                finally:
                    proposer.gamma = old

            return _median2(call, repeats, draft_phase)

        per = []
        for r in requests:
            d_ms = drafting(r, draft_context)[ci]
            bar.update()
            for s in range(r):
                ft.truncate(s, draft_context)
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

            # R requests' tokens in one forward against the same tokens as ONE request: the
            # per-request attention calls the table (one request) does not pay; 0 at R = 1
            # (the same call). Timed as alternating pairs, the median of the pairs'
            # differences: the machine's drift moves both calls of a pair alike
            extra = _paired_diff(many, one, max(repeats, 9), ci, 4 * r) if r > 1 else 0.0
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
            s_us = _median2(lambda inp=inp: policy.schedule(inp), max(repeats, 20))[ci] * 1000.0
            bar.update()
            per.append((r, d_ms, extra, s_us))
        # drafting against context (R = 4 requests) and block length (gamma 1 vs the block)
        r_c = min(4, r_max)
        terms = []
        for c in d_ctxs:
            terms.append(("draft_context", r_c, c, g, drafting(r_c, c)[ci]))
            bar.update()
        for gg in sorted({1, g}):
            ms = drafting(r_c, draft_context, gg)[ci]
            terms.append(("draft_block", r_c, draft_context, gg, ms))
            bar.update()
    per_req = pd.DataFrame(per, columns=["requests", "draft_ms", "verify_extra_ms", "sched_us"])
    terms_df = pd.DataFrame(terms, columns=["term", "requests", "context", "gamma", "ms"])
    terms_df = pd.concat(
        [
            terms_df,
            pd.DataFrame(
                [("prefill", 1, p, 0, (cw[0] if ci == 0 else cw[1])) for p, *cw in pre_pts],
                columns=terms_df.columns,
            ),
        ],
        ignore_index=True,
    )
    rr = per_req["requests"].to_numpy(np.float64)
    d_slope, d_base = np.polyfit(rr, per_req["draft_ms"].to_numpy(), 1)
    v_slope = float(np.polyfit(rr - 1.0, per_req["verify_extra_ms"].to_numpy(), 1)[0])
    s_slope, s_base = np.polyfit(rr, per_req["sched_us"].to_numpy(), 1)
    # context: ms per request per attended context token -> us
    dc = terms_df[terms_df.term == "draft_context"]
    eff = np.minimum(dc["context"].to_numpy(np.float64), window) if window else dc["context"]
    ctx_us = max(float(np.polyfit(np.asarray(eff, np.float64), dc["ms"].to_numpy(), 1)[0]), 0.0)
    ctx_us = ctx_us / r_c * 1000.0
    db = terms_df[terms_df.term == "draft_block"].sort_values("gamma")
    tok_ms = 0.0
    if len(db) == 2 and g > 1:
        tok_ms = max(float(db["ms"].iloc[1] - db["ms"].iloc[0]) / (r_c * (g - 1)), 0.0)
    c0 = min(draft_context, window) if window else draft_context
    per_request = max(float(d_slope) - tok_ms * g - ctx_us * 1e-3 * c0, 0.0)
    # prompt tokens: beyond the table's B = 1 forward (a prefill-only step is table(1) + k P)
    b1 = steps[steps["batch_tokens"] == steps["batch_tokens"].min()]
    t1 = float(b1.sort_values("context_tokens")["step_ms"].iloc[0])
    pp = np.array([p for p, *_ in pre_pts], np.float64)
    pt = np.array([cw[ci] for _, *cw in pre_pts], np.float64)
    pre_ms = max(float(np.sum(pp * (pt - t1)) / np.sum(pp * pp)), 1e-6)
    # the engine loop's own overhead (admission, building the batch, accepting, streaming,
    # splitting attention per request), measured by running the engine itself on random prompts
    table_only = _table_cost(steps)
    draft_model = CostModel(
        name="draft",
        batch_tokens=np.array([1, 2]),
        step_ms=np.array([1.0, 1.0]),
        draft_base_ms=float(max(d_base, 0.0)),
        draft_per_request_ms=per_request + tok_ms * g,
        draft_per_context_us=ctx_us,
        draft_context_window=window,
        sched_base_us=float(max(s_base, 0.0)),
        sched_us_per_request=float(max(s_slope, 0.0)),
    )
    over, per_tok = _loop_overhead(
        model,
        proposer,
        table_only,
        requests,
        layout,
        gen,
        vocab,
        clock,
        draft_model,
        prompt=draft_context,
        draft_phase=draft_phase,
        gamma=g,
    )
    per_req = per_req.merge(over, on="requests")
    o_slope, o_base = np.polyfit(rr, per_req["loop_overhead_ms"].to_numpy(), 1)
    # Drafting at each R as the engine itself spent it (its draft timer in the calibration
    # runs, less the context and per-token terms): it grows faster than linearly in R, and
    # v3's straight line through proposals timed back to back charged the grid's C = 4-16
    # cells 13-20% too little drafting (1 Dec 2026). The loop overhead at each R: the
    # forward's per-request attention calls (R requests against one of the same tokens,
    # alternating pairs) plus the loop's own timers. The step's residual (step - drafting -
    # table) is kept as a variant: a difference of two 100-400 ms numbers, it moved by 20 ms
    # at R = 16 between the two drafters' profiles of one pilot, where the split moved by 1.
    curve = [
        (int(r), round(max(float(v), 0.0) + max(float(lp), 0.0), 4))
        for r, v, lp in zip(rr, per_req["verify_extra_ms"], per_req["loop_ms"], strict=True)
    ]
    d_curve = [
        (int(r), round(max(float(m) - tok_ms * g * r, 0.0), 4))
        for r, m in zip(rr, per_req["engine_draft_ms"], strict=True)
    ]
    engine_curve = [
        (int(r), max(float(m), 0.0)) for r, m in zip(rr, per_req["engine_overhead_ms"], strict=True)
    ]
    resid_curve = [
        (int(r), max(float(m), 0.0)) for r, m in zip(rr, per_req["loop_overhead_ms"], strict=True)
    ]
    k4_curve = [  # v5's loop: one number per R at 4 tokens a request (term ablation)
        (int(r), max(float(v), 0.0) + max(float(lp), 0.0))
        for r, v, lp in zip(rr, per_req["verify_extra_ms"], per_req["loop_k4_ms"], strict=True)
    ]
    piv = steps.pivot_table(index="context_tokens", columns="batch_tokens", values="step_ms")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    meta = {
        "source": "measured by specsim.torch_engine.cost_calibration (the engine's own forward)",
        "clock": clock,
        "measured_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "torch_threads": str(torch.get_num_threads()),
        "loadavg_1min": f"{load:.2f}",
        "layout": layout,
        "draft_context": str(draft_context),
        "verify_split_ms_per_request": f"{max(v_slope, 0.0):.4f}",
        # the straight line through the loop overhead (the v1/v2 form; overhead_curve is used)
        "overhead_linear_fit": f"{max(o_base, 0.0):.4f} + {max(o_slope, 0.0):.4f} R",
        # the residual at each R (v3's first measurement), kept for the term ablation
        "overhead_residual_curve": ",".join(f"{r}:{m:.4f}" for r, m in resid_curve),
        # the step less the engine's drafting, the modelled policy and the table, at each R
        "overhead_engine_curve": ",".join(f"{r}:{m:.4f}" for r, m in engine_curve),
        # v5's overhead curve (the loop at 4 tokens a request, no per-token term)
        "overhead_k4_curve": ",".join(f"{r}:{m:.4f}" for r, m in k4_curve),
        "repeats": str(repeats),
    }
    lim = limits or {}
    scal = {
        "draft_base_ms": round(float(max(d_base, 0.0)), 4),
        "draft_per_request_ms": round(per_request, 4),
        "draft_per_token_ms": round(tok_ms, 5),
        "draft_per_context_us": round(ctx_us, 4),
        "sched_base_us": round(float(max(s_base, 0.0)), 2),
        "sched_us_per_request": round(float(max(s_slope, 0.0)), 3),
        "step_overhead_ms": 0.0,  # the loop overhead is the measured curve below
        "verify_per_request_ms": 0.0,
        "prefill_token_ms": round(pre_ms, 5),
        "accept_per_token_ms": round(per_tok, 5),
    }

    def model_on(table: Any, scale: float, clk: str) -> Any:
        return CostModel(
            name=name,
            batch_tokens=table.columns.to_numpy(np.int64),
            step_ms=table.to_numpy(np.float64) if len(table) > 1 else table.to_numpy()[0],
            context_tokens=table.index.to_numpy(np.float64) if len(table) > 1 else None,
            draft_context_window=window,
            max_running=int(lim.get("max_running", 256)),
            kv_tokens=int(lim.get("kv_tokens", 1 << 20)),
            prefill_budget=int(lim.get("prefill_budget", 16384)),
            meta={**meta, "clock": clk},
            overhead_curve=tuple((int(r), round(m * scale, 4)) for r, m in curve),
            draft_curve=tuple((int(r), round(m * scale, 4)) for r, m in d_curve),
            **{k: round(v * scale, 5) for k, v in scal.items()},
        )

    cost = model_on(piv, 1.0, clock)
    other_clk = "wall" if clock != "wall" else "cpu"
    other_col = f"step_ms_{other_clk}"
    piv2 = steps.pivot_table(index="context_tokens", columns="batch_tokens", values=other_col)
    ratio = float(np.median(steps[other_col] / steps["step_ms"]))
    other = model_on(piv2, ratio, other_clk)
    other.meta["scalars_scaled_from"] = f"{clock} clock x {ratio:.4f}"
    return EngineProfile(
        cost=cost, steps=steps, per_request=per_req, other=other, terms=terms_df,
        prefill_points=pre_pts,
    )  # fmt: skip


def _time_table(  # type: ignore[no-untyped-def]
    model, proposer, contexts, batch_tokens, prefill_tokens, cap, layout, gen, vocab, passes, ci,
    bar,
):  # fmt: skip
    """The step table and the prefill points, timed in ``passes`` interleaved passes:
    (steps DataFrame, [(prompt tokens, cpu ms, wall ms)])."""
    import pandas as pd

    ft = FlatTarget(model, len(contexts) + 1, cap, proposer.feature_layers, layout)
    # Interleaved passes: every pass times every point once, in a shuffled order. Each
    # timing is PAIRED with one of an anchor (the smallest batch at the first context) right
    # before it, and a point's value is the median of its pairs' ratios times the anchor's
    # median over all pairs: the VM's speed moves +-20% within seconds, alike for both calls
    # of a pair, so the ratios keep the curve's shape where medians of 3-5 lone timings
    # bent it (B = 2 / 3 at 1.03x / 1.23x of B = 1 where paired timing and the engine give
    # 1.055x / 1.137x, docs/fidelity.md). Slot c holds context contexts[c] (filled once);
    # the last slot takes the prefills (from an empty cache, logits on the last token only,
    # as the engine runs them).
    slots_ctx = {ctx: i for i, ctx in enumerate(contexts)}
    pre_slot = len(contexts)
    for ctx, slot in slots_ctx.items():
        _fill(ft, slot, ctx, gen, vocab)
    points = [(ctx, b) for ctx in contexts for b in batch_tokens]
    points += [(-1, p) for p in prefill_tokens]  # context -1: a prefill
    anchor = (contexts[0], min(batch_tokens))  # one of the points
    toks = {pt: _ids(gen, vocab, pt[1]).tolist() for pt in points}

    def point_call(pt: tuple[int, int]):  # type: ignore[no-untyped-def]
        ctx, tok = pt[0], toks[pt]
        if ctx < 0:

            def call() -> None:
                ft.reset(pre_slot)
                ft.forward([pre_slot], [tok], [1])
                _sync(model)
        else:
            slot = slots_ctx[ctx]

            def call() -> None:
                ft.forward([slot], [tok])
                _sync(model)
                ft.truncate(slot, ctx)

        return call

    calls = {pt: point_call(pt) for pt in toks}
    ratios: dict[tuple[int, int], list[tuple[float, float]]] = {pt: [] for pt in points}
    anchor_t: list[tuple[float, float]] = []
    for rep in range(passes + 1):  # pass 0 is a warm-up
        for k in gen.permutation(len(points)):
            pt = points[int(k)]
            for _ in range(SMALL_PAIRS if 0 <= pt[0] and pt[1] <= SMALL_B else 1):
                ta = _timed(calls[anchor], tokens=anchor[1])
                # the pair shares one calibration; each call at its own size's factor
                tp = _timed(calls[pt], calibrate=False, tokens=pt[1])
                if rep:
                    anchor_t.append(ta)
                    ratios[pt].append((tp[0] / ta[0], tp[1] / ta[1]))
        bar.update(len(points) / (passes + 1))
    med = _anchor_scaled(anchor, anchor_t, ratios)
    rows = [(ctx, b, med[(ctx, b)][ci], *med[(ctx, b)]) for ctx, b in points if ctx >= 0]
    cols = ["context_tokens", "batch_tokens", "step_ms", "step_ms_cpu", "step_ms_wall"]
    steps = pd.DataFrame(rows, columns=cols)
    pre_pts = [(p, *med[(-1, p)]) for p in prefill_tokens]
    return steps, pre_pts


def _draft_contexts(draft_context: int, window: int) -> tuple[int, ...]:
    """Anchors at which drafting is timed against context: up to the window and past it."""
    top = window or max(2 * draft_context, 64)
    return tuple(sorted({16, max(top // 2, 17), top}))


def _lift_tail(steps: Any, col: str) -> None:
    last = steps.groupby("context_tokens")["batch_tokens"].transform("max")
    prev = steps[steps["batch_tokens"] < last].groupby("context_tokens")[col].last()
    tail = steps["batch_tokens"] == last
    steps.loc[tail, col] = np.maximum(
        steps.loc[tail, col].to_numpy(),
        steps.loc[tail, "context_tokens"].map(prev).to_numpy(),
    )


def _table_cost(steps: Any) -> Any:
    """A CostModel of the step table alone (no draft, no scheduler costs)."""
    from specsim.sim.cost.model import CostModel

    piv = steps.pivot_table(index="context_tokens", columns="batch_tokens", values="step_ms")
    return CostModel(
        name="table",
        batch_tokens=piv.columns.to_numpy(np.int64),
        step_ms=piv.to_numpy(np.float64) if len(piv) > 1 else piv.to_numpy(np.float64)[0],
        context_tokens=piv.index.to_numpy(np.float64) if len(piv) > 1 else None,
    )
