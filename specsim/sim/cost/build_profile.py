"""A built deployment as a profile (a CostModel any ``--profile`` takes) and as a printed bill.

Why a separate module: :mod:`~specsim.sim.cost.build` prices the terms; this one sums them into
the profile's table and header (every assumed term at the chosen point) and says, term by term,
what a step costs at a few batch sizes with the low-high range of whatever was assumed.
"""

from __future__ import annotations

import numpy as np

from specsim.sim.cost import build as bd
from specsim.sim.cost.drafters import Drafter, context_us, draft_ms, parse_drafter, prefill_us
from specsim.sim.cost.model import CostModel
from specsim.sim.cost.profiles import cuda_graph_buckets

SHOW_TOKENS = (1, 64, 256)
DRAFT_REQUESTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
HELDOUT_ERROR = "held-out median 5%, p90 15% (H100); carried H100 -> A100 median 8%, p90 17%"


def build(dep: bd.Deployment, engine: bd.Engine | None = None
          ) -> tuple[CostModel, bd.Priced, Drafter]:  # fmt: skip
    """The profile of ``dep`` with every assumed term at ``dep.point`` (``engine``: terms to use
    instead of the named engine's, as ``build.check`` takes them)."""
    p = bd.check(dep, engine)
    m, eng, pt = dep.model, p.eng, dep.point
    drafter = parse_drafter(dep.drafter, m.hidden, m.vocab)
    b = bd.table_points(p)
    step = np.maximum.accumulate(bd.table_ms(p, b))  # more tokens never cheaper
    max_running = eng.max_running * dep.dp
    # the drafter's graphs are captured at the target's sizes (a batch pays the next one)
    grid = np.union1d(cuda_graph_buckets(min(max_running, 4096)), DRAFT_REQUESTS)
    reqs = np.append(grid[grid < max_running], max_running)
    dcurve = np.maximum.accumulate(draft_ms(p, drafter, reqs, pt))
    kv_tokens = int(bd.hbm_free(p, pt) * dep.dp / p.kv_bytes_gpu)  # every TP rank: its share
    meta = {
        "source": f"specsim profile build: {m.name} on {dep.gpus} x {p.ops.gpu} (TP {dep.tp}, "
        f"EP {dep.ep}, DP {dep.dp}), {dep.engine}, drafter {drafter.label}",
        "operators": "Vidur measured operator curves (MIT, Microsoft Corporation, commit "
        f"7d47513) from {p.ops.reference.upper()}, carried to {p.ops.gpu}: {HELDOUT_ERROR}",
        "model_source": m.source + (f"; derived: {m.derived}" if m.derived else ""),
        "weight_dtype": dep.weight_dtype or m.weight_dtype,
        "kv_dtype": dep.kv_dtype,
        "assumed_point": pt,
        "assumed": "; ".join(assumptions(p)),
    }
    model = CostModel(
        name=f"{m.name}-{dep.gpu.lower()}-tp{dep.tp}-{dep.engine}",
        batch_tokens=b,
        step_ms=np.maximum(step, 1e-3),
        step_overhead_ms=eng.step_ms.at(pt),
        verify_per_request_ms=eng.per_request_us.at(pt) / 1000.0,
        accept_per_token_ms=bd.sampling_ms(p, pt),
        kv_read_us_per_ktoken=bd.kv_read_us_per_ktoken(p),
        draft_curve=tuple(
            (int(r), float(max(ms, 0.0))) for r, ms in zip(reqs, dcurve, strict=True)
        ),  # fmt: skip
        draft_per_context_us=context_us(p, drafter),
        draft_prefill_us_per_token=prefill_us(p, drafter),
        max_running=max_running,
        kv_tokens=max(kv_tokens, 1),
        max_batched_tokens=eng.max_batched_tokens * dep.dp,
        gpus=dep.gpus,
        interpolation="step",
        capture_max_tokens=int(eng.capture_max_tokens * dep.dp),
        meta=meta,
    )
    return model, p, drafter


def assumptions(p: bd.Priced) -> list[str]:
    """Every assumed (not measured) fact, with its range."""
    e = p.eng
    return [
        f"{e.name} step overhead {e.step_ms.low:g}-{e.step_ms.high:g} ms ({e.step_ms.why})",
        f"{e.name} per request {e.per_request_us.low:g}-{e.per_request_us.high:g} us",
        f"sampling {bd.SAMPLING_PASSES.low:g}-{bd.SAMPLING_PASSES.high:g} passes over the "
        "logits per verified token",
        f"activation reserve {bd.ACTIVATION_GIB.low:g}-{bd.ACTIVATION_GIB.high:g} GiB per GPU, "
        f"{bd.HBM_SHARE:.0%} of HBM usable",
        f"capture to {e.capture_max_tokens} tokens, max_running {e.max_running}, "
        f"max_batched_tokens {e.max_batched_tokens} per DP rank (engine defaults)",
        "uniform expert routing; attention kernel = one GEMM launch per layer",
    ]


def bill(dep: bd.Deployment) -> tuple[CostModel, str]:
    """The profile and the printed bill: each term at 1, 64 and 256 tokens (decode: one token a
    request), a low-high range where the term is assumed."""
    model, p, drafter = build(dep)
    b = bd.pad_to_table(model, SHOW_TOKENS)
    terms = bd.step_terms(p, b)
    r = np.array(SHOW_TOKENS, dtype=np.float64)
    e = p.eng
    rows = [(k, v, None) for k, v in terms.items()]
    ctx = 1024.0
    rows.append(("kv read @1k ctx", model.kv_read_us_per_ktoken * r * ctx / 1e6, None))
    samp = [bd.sampling_ms(p, q) * r for q in bd.POINTS]
    rows.append(("sampling", samp[1], (samp[0], samp[2])))
    over = [e.step_ms.at(q) + e.per_request_us.at(q) * r / 1000.0 for q in bd.POINTS]
    rows.append(("engine overhead", over[1], (over[0], over[2])))
    drafts = [draft_ms(p, drafter, r, q) for q in bd.POINTS]
    dctx = context_us(p, drafter) * r * ctx / 1000.0
    rng = (drafts[0] + dctx, drafts[2] + dctx) if drafter.kind == "ngram" else None
    rows.append((f"drafter ({drafter.kind})", drafts[1] + dctx, rng))
    head = f"  {'term (ms)':<22}" + "".join(f"{f'B={t}':>22}" for t in SHOW_TOKENS)
    lines = [f"{model.name}: {model.meta['source']}", head]
    total = np.zeros_like(r)
    for name, mid, lohi in rows:
        total = total + mid
        cells = [f"{v:.3f}" if lohi is None else f"{v:.3f} ({lo:.3f}-{hi:.3f})"
                 for v, lo, hi in zip(mid, *(lohi or (mid, mid)), strict=True)]  # fmt: skip
        lines.append(f"  {name:<22}" + "".join(f"{c:>22}" for c in cells))
    lines.append(f"  {'total (mid)':<22}" + "".join(f"{v:>22.3f}" for v in total))
    lines.append(
        f"  step table (weights..lm head, padded): 256 vs 1 token x"
        f"{model.step_time(256) / model.step_time(1):.2f}; prefill attention at a 2k prompt "
        f"+{bd.prefill_attention_us_per_token(p, 2048):.2f} us/prompt token (not in the table)"
    )
    lines.append(
        f"  limits: {model.gpus} GPU(s), {p.weights_gpu / 1e9:.1f} GB weights/GPU, kv_tokens "
        f"{model.kv_tokens:,}, max_running {model.max_running}, max_batched_tokens "
        f"{model.max_batched_tokens:,}"
    )
    lines.append(f"  measured: {model.meta['operators']}")
    lines.append("  assumed: " + "; ".join(assumptions(p)))
    if p.dep.model.derived:
        lines.append(f"  model facts derived: {p.dep.model.derived}")
    return model, "\n".join(lines)


__all__ = ["assumptions", "bill", "build"]
