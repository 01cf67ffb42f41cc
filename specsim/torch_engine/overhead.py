"""The engine loop's own cost per step, outside the target forward, the drafting and the policy:
measured by running the engine itself at R decoding requests (two passes, so the loop splits
into a part per request and a part per verified token)."""

from __future__ import annotations

from typing import Any

import numpy as np

from specsim.torch_engine.speed import _ids
from specsim.torch_engine.timing import _median2, _median_ms, _paired_diff, _timed  # noqa: F401


def _loop_overhead(
    model: Any,
    proposer: Any,
    table: Any,
    requests: tuple[int, ...],
    layout: str,
    gen: np.random.Generator,
    vocab: int,
    clock: str = "wall",
    draft_model: Any = None,
    prompt: int = 32,
    out: int = 48,  # ~12 decode steps of 4 tokens each per request, twice: a stable median
    draft_phase: str = "draft",
    gamma: int = 3,
) -> tuple[Any, float]:
    """Median per-step time the engine spends outside the target forward's table cost, the
    drafting and the policy, at R decoding requests (``static:3``: 4 tokens each), at a context
    the table covers (``prompt``: the workload's typical context; a context below the table's
    first one would be charged at it and make the residual negative).

    Columns: ``loop_overhead_ms``, the residual with the MODEL's drafting and policy subtracted
    (v3's first form, kept for the term ablation); ``loop_ms``, the loop's own timers;
    ``engine_draft_ms``, the engine's draft timer less the model's context term; and
    ``engine_overhead_ms``, the step less the engine's drafting, the modelled policy and the
    table (kept as a term-ablation variant). ``engine_draft_ms`` is what the cost model's
    ``draft_curve`` is made from, ``loop_ms`` part of its ``overhead_curve``. Measured in the
    engine, a draft pays for following a forward of another shape (caches, allocator: up to
    ~10% more than back to back) and a forward of R requests for their R attention calls.

    The second pass verifies full blocks (``static:gamma``, gamma + 1 tokens a request), so the
    loop's timers can be split into a part per request and a part per verified token (the
    argmax or sampling at every verified row, committing, streaming): a least-squares fit of
    every step's loop time on R and the verified tokens B gives ``accept_per_token_ms`` (the
    second value returned), and ``loop_ms`` at each R is the median of the loop time less it.
    In v5 the loop was one number per R measured at 4 tokens a request, which charged the
    grid's full-block steps half of what they paid and its one-token steps three times.
    ``loop_k4_ms`` keeps that form (the first pass's median) for the term ablation; with 3
    drafts or fewer the first pass verifies none (:func:`calibration_policies`)."""
    import pandas as pd

    from specsim.policies.base import get_policy
    from specsim.sim.workload import Workload
    from specsim.torch_engine.engine import EngineConfig, RealEngine

    steps = {r: [] for r in requests}
    first, full = calibration_policies(gamma)
    # two passes, the second in the reverse order: a drift of the machine's speed during the
    # calibration then moves the small and the large R alike; the second verifies full blocks
    order = [(r, 0, first) for r in requests]
    order += [(r, 1, full) for r in reversed(requests)]
    for r, pass_i, pol in order:
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
            get_policy(pol),
            table,
            prompts,
            wl,
            EngineConfig(
                max_running=r, layout=layout, warmup_steps=1, clock=clock, draft_phase=draft_phase
            ),
        ).run()
        st = res.steps
        steps[r].append(st[(st["prefilling"] == 0) & (st["decoding"] == r)].assign(pass_i=pass_i))
    per_token = _accept_per_token(pd.concat([x for v in steps.values() for x in v]))
    rows = []
    for r in requests:
        st = pd.concat(steps[r], ignore_index=True)
        pred = np.array(
            [
                table.step_time(int(b), float(c))
                for b, c in zip(st["batch_tokens"], st["ctx_mean"], strict=True)
            ]
        )
        ctx_s = np.zeros(len(st))
        if draft_model is not None:  # the drafter reads contexts up to each anchor
            ctx_s = np.array(
                [draft_model.draft_context_s(np.full(r, int(c) - 1)) for c in st["ctx_mean"]]
            )
            d_s = draft_model.draft_ms(r, 0) * 1e-3 + ctx_s
            s_s = draft_model.sched_s(r)  # the policy alone; building its input is loop
        else:
            d_s, s_s = st["draft_s"].to_numpy(), st["sched_s"].to_numpy()
        dur = st["duration_s"].to_numpy()
        resid = dur - d_s - s_s - pred
        own = st["duration_s"] - st["draft_s"] - st["sched_s"] - st["verify_s"]
        # the engine's own drafting (its draft timer) less the context term, and everything
        # else of the step beyond the table and the modelled policy (a variant, not used)
        e_draft = st["draft_s"].to_numpy() - ctx_s
        e_over = dur - st["draft_s"].to_numpy() - s_s - pred
        own_req = own.to_numpy() - per_token * 1e-3 * st["batch_tokens"].to_numpy()
        own_k4 = own[st["pass_i"] == 0].to_numpy()
        meds = [
            float(np.median(x)) * 1000.0 if len(x) else 0.0
            for x in (resid, own_req, e_draft, e_over, own_k4)
        ]
        rows.append((r, *meds, len(st)))
    cols = [
        "loop_overhead_ms", "loop_ms", "engine_draft_ms", "engine_overhead_ms", "loop_k4_ms",
        "steps",
    ]  # fmt: skip
    return pd.DataFrame(rows, columns=["requests", *cols]), per_token


def calibration_policies(gamma: int) -> tuple[str, str]:
    """The loop calibration's two passes: 4 tokens a request (``static:3``), then full blocks
    (``static:gamma``). A block of 3 or fewer drafts would make the two passes verify the same
    tokens, so that the per-token slope could not be told from the per-request part
    (``_accept_per_token`` returns 0 when B does not vary apart from R); there the first pass
    verifies no drafts (``static:0``, one token a request) instead."""
    k_full = max(int(gamma), 1)
    return ("static:3" if k_full > 3 else "static:0"), f"static:{k_full}"


def _accept_per_token(steps: Any) -> float:
    """ms of the engine loop per verified token: the least-squares slope in B of every
    calibration step's loop time (duration less drafting, policy and forward) on ``1, R, B``
    (decode-only steps, so B is the verified tokens). 0 when B does not vary apart from R
    (one block length) or the slope comes out negative."""
    own = (steps["duration_s"] - steps["draft_s"] - steps["sched_s"] - steps["verify_s"]) * 1e3
    r, b = steps["decoding"].to_numpy(float), steps["batch_tokens"].to_numpy(float)
    x = np.column_stack([np.ones(len(steps)), r, b])
    if len(steps) < 4 or np.linalg.matrix_rank(x) < 3:
        return 0.0
    coef, *_ = np.linalg.lstsq(x, own.to_numpy(float), rcond=None)
    return max(float(coef[2]), 0.0)
