"""Profile the target step: wall time of a batched verification forward against token batch B.

A verification step of R requests, each verifying t tokens after a cached context of C tokens, is
one target forward over R x t new tokens with a KV cache. For each context C and each token batch
B we time exactly that (R = ceil(B / 8) requests, t = B / R tokens each, as a scheduler verifying
up to gamma + 1 = 8 tokens per request produces), after a warm-up, and keep the median of
``repeats`` runs. The cache is cropped back to C after every run, so every run sees the same
state. Optionally the drafter's forward (one block for R requests) is timed too and fitted as
``draft_base_ms + draft_per_request_ms * R``.

The result is the SPS profile CSV the simulator reads (``specsim/sim/cost/profiles.py``).
"""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from specsim.progress import Progress
from specsim.record.models import crop_cache, forward_cached, output_cache

TOKENS_PER_REQUEST = 8


def _shape(b: int) -> tuple[int, int]:
    r = max(1, math.ceil(b / TOKENS_PER_REQUEST))
    return r, math.ceil(b / r)


def time_step(
    target: Any, batch_tokens: int, context: int, repeats: int, seed: int = 0, clock: str = "wall"
) -> float:
    """Median ms of one verification forward of ``batch_tokens`` tokens at context ``context``.

    ``clock="cpu"`` measures process CPU time instead of wall time: on a shared machine it is
    what the step costs the cores it runs on, without the time other jobs held them (use it
    with one thread; with several it sums their time).
    """
    now = time.process_time if clock == "cpu" else time.perf_counter
    import torch

    r, t = _shape(batch_tokens)
    gen = torch.Generator().manual_seed(seed)
    vocab = target.model.config.vocab_size
    ctx = torch.randint(min(100, vocab // 2), vocab, (1, context), generator=gen)
    new = torch.randint(min(100, vocab // 2), vocab, (r, t), generator=gen)
    dev = target.device
    with torch.no_grad():
        # one prefill, its KV repeated for the R requests (content does not change the cost)
        cache = output_cache(forward_cached(target.model, ctx.to(dev), None))
        if r > 1:
            cache.batch_repeat_interleave(r)
        times = []
        for i in range(repeats + 1):
            if dev.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = now()
            forward_cached(target.model, new.to(dev), cache)
            if dev.startswith("cuda"):
                torch.cuda.synchronize()
            dt = now() - t0
            crop_cache(cache, context)
            if i:  # the first run is a warm-up
                times.append(dt * 1000)
    return statistics.median(times)


def time_drafter(
    target: Any, drafter: Any, requests: list[int], repeats: int, clock: str = "wall"
) -> dict[str, float]:
    """Fit draft_ms = base + per_request * R from timed drafter forwards."""
    now = time.process_time if clock == "cpu" else time.perf_counter
    import torch

    n_feat = len(drafter.cfg.target_layer_ids) * target.model.config.hidden_size
    ctx = 128
    ms = []
    for r in requests:
        feats = torch.randn(ctx + r, n_feat, dtype=torch.float16)
        seq = torch.randint(0, target.model.config.vocab_size, (ctx + r + 8,))
        anchors = torch.arange(ctx, ctx + r)
        vals = []
        for i in range(repeats + 1):
            t0 = now()
            drafter.draft(feats, seq, anchors)
            if i:
                vals.append((now() - t0) * 1000)
        ms.append(statistics.median(vals))
    slope, base = np.polyfit(np.asarray(requests, float), np.asarray(ms), 1)
    return {
        "draft_base_ms": round(float(max(base, 0.0)), 3),
        "draft_per_request_ms": round(float(max(slope, 0.0)), 3),
    }


def profile_target(
    target: Any,
    batch_tokens: list[int],
    contexts: list[int],
    repeats: int = 5,
    drafter: Any = None,
    clock: str = "wall",
) -> tuple[pd.DataFrame, dict[str, float]]:
    """A tidy table (context_tokens, batch_tokens, step_ms, requests, tokens_per_request)."""
    rows = []
    with Progress(len(batch_tokens) * len(contexts), "profile", " points") as bar:
        for c in contexts:
            for b in batch_tokens:
                r, t = _shape(b)
                ms = time_step(target, b, c, repeats, clock=clock)
                rows.append(
                    {
                        "context_tokens": c,
                        "batch_tokens": b,
                        "step_ms": round(ms, 3),
                        "requests": r,
                        "tokens_per_request": t,
                    }
                )
                bar.update()
    scalars: dict[str, float] = {}
    if drafter is not None:
        scalars.update(time_drafter(target, drafter, [1, 4, 8, 16], repeats, clock))
    return pd.DataFrame(rows), scalars


def write_profile(
    table: pd.DataFrame,
    scalars: dict[str, float],
    out: Path,
    target: Any,
    force: bool = False,
    extra: dict[str, str] | None = None,
) -> Path:
    """Write the SPS profile CSV (``# key: value`` header lines, then the table)."""
    from specsim.sim.cost.model import CostModel
    from specsim.sim.cost.profiles import write_profile_csv

    piv = table.pivot_table(index="context_tokens", columns="batch_tokens", values="step_ms")
    prov = target.provenance()
    meta = {
        "source": "measured by specsim profile",
        "measured_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "tokens_per_request": str(TOKENS_PER_REQUEST),
        **{k: v for k, v in prov.items()},
        **(extra or {}),
    }
    model = CostModel(
        name=out.stem,
        batch_tokens=piv.columns.to_numpy(np.int64),
        step_ms=piv.to_numpy(np.float64) if len(piv) > 1 else piv.to_numpy(np.float64)[0],
        context_tokens=piv.index.to_numpy(np.float64) if len(piv) > 1 else None,
        meta=meta,
        **scalars,
    )
    return write_profile_csv(model, out, force=force)
