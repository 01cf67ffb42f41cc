"""A built deployment as a profile (a CostModel any ``--profile`` takes) and as a printed bill.

Why a separate module: :mod:`~specsim.sim.cost.build` prices the terms; this one sums them into
the profile's table and header (every assumed term at the chosen point) and says, term by term,
what a step costs at a few batch sizes with the low-high range of whatever was assumed.
"""

from __future__ import annotations

import numpy as np

from specsim.errors import SpecsimError
from specsim.sim.cost import build as bd
from specsim.sim.cost import paths
from specsim.sim.cost.assumed import CORNERS
from specsim.sim.cost.drafters import (
    WEIGHTS_ASSUMED,
    Drafter,
    context_us,
    draft_ms,
    draft_step_ms,
    prefill_us,
)
from specsim.sim.cost.graphs import cuda_graph_buckets
from specsim.sim.cost.model import CostModel

SHOW_TOKENS = (1, 64, 256)
KV_CTX = 1024.0  # the context the printed KV read is at
DRAFT_REQUESTS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
HELDOUT_ERROR = "held-out median 5%, p90 15% (H100); carried H100 -> A100 median 8%, p90 17%"


def build(dep: bd.Deployment, engine: bd.Engine | None = None
          ) -> tuple[CostModel, bd.Priced, Drafter]:  # fmt: skip
    """The profile of ``dep`` with every assumed term at ``dep.point`` (``engine``: terms to use
    instead of the named engine's, as ``build.check`` takes them)."""
    p = bd.check(dep, engine)
    dep, drafter = p.dep, p.drafter  # the checked deployment (the GPU by its table name)
    m, eng, pt = dep.model, p.eng, dep.point
    b = bd.table_points(p)
    step = np.maximum.accumulate(bd.table_ms(p, b))  # more tokens never cheaper
    max_running = eng.max_running * dep.dp
    # the drafter's graphs are captured at the target's sizes (a batch pays the next one)
    grid = np.union1d(cuda_graph_buckets(min(max_running, 4096)), DRAFT_REQUESTS)
    reqs = np.append(grid[grid < max_running], max_running)
    dcurve = np.maximum.accumulate(draft_ms(p, drafter, reqs, pt))
    _check_terms(p, b, reqs, dcurve)
    dstep = draft_step_ms(p, drafter, reqs, pt)
    step_curve: tuple = ()
    if dstep is not None:  # sequential: the call is its fixed part + k x a step
        dstep = np.maximum.accumulate(dstep)
        dcurve = np.maximum(dcurve - drafter.drafts * dstep, 0.0)
        step_curve = tuple((int(r), float(v)) for r, v in zip(reqs, dstep, strict=True))
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
        attn_us_per_qk_ktoken=bd.attn_us_per_qk_ktoken(p),
        tree_tokens_per_request=drafter.tree_extra,
        mixed_step_ms=bd.mixed_step_ms(p),
        draft_curve=tuple(
            (int(r), float(max(ms, 0.0))) for r, ms in zip(reqs, dcurve, strict=True)
        ),  # fmt: skip
        draft_step_curve=step_curve,
        draft_per_context_us=context_us(p, drafter),
        draft_prefill_us_per_token=prefill_us(p, drafter),
        max_running=max_running,
        kv_tokens=bd.kv_tokens(p, pt),  # >= 1: check refuses a deployment without room
        max_batched_tokens=eng.max_batched_tokens * dep.dp,
        gpus=dep.gpus,
        interpolation="linear" if eng.graph_mode == "none" else "step",  # eager: no padding
        capture_max_tokens=int(eng.capture_max_tokens * dep.dp),
        meta=meta,
    )
    return model, p, drafter


def _check_terms(p: bd.Priced, b: np.ndarray, reqs: np.ndarray, dcurve: np.ndarray) -> None:
    """Every term of the table and the draft curve finite and >= 0, or one line naming it.
    Why: the model's rules (``models.check_arch``) should make this hold; a term that does
    not must stop the build, not be clipped into a profile that replays."""
    named = {**bd.step_terms(p, b), "drafter": np.asarray(dcurve, dtype=np.float64),
             "kv read": np.array([bd.kv_read_us_per_ktoken(p)])}  # fmt: skip
    for name, v in named.items():
        if not np.all(np.isfinite(v)) or np.any(v < 0):
            raise SpecsimError(
                f"{p.dep.model.name}: the {name} term comes out negative or not finite on "
                f"{p.dep.gpus} x {p.ops.gpu}; check the model's numbers (--model)"
            )


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
        f"max_num_seqs {e.max_running}, max_num_batched_tokens {e.max_batched_tokens} per DP "
        f"rank ({'as given' if p.dep.max_running or p.dep.max_batched_tokens else 'defaults'})",
        "uniform expert routing; attention kernel = one GEMM launch per layer",
        *_latency_assumed(p),
        *_kernel_path(p),
        *([WEIGHTS_ASSUMED] if p.drafter_weights_gpu else []),
    ]


def _target_rows(p: bd.Priced, model: CostModel, tokens, requests) -> list[tuple]:
    """The target's terms of a step of ``tokens`` tokens over ``requests`` requests (arrays),
    each (name, mid, (low, high) or None): operators by tokens, the KV read and the engine's
    per-request overhead by requests, sampling by tokens."""
    b = bd.pad_to_table(model, tokens)
    t = np.asarray(tokens, dtype=np.float64)
    r = np.asarray(requests, dtype=np.float64)
    e = p.eng
    rows: list[tuple] = [(k, v, None) for k, v in bd.step_terms(p, b).items()]
    rows.append(("kv read @1k ctx", model.kv_read_us_per_ktoken * r * KV_CTX / 1e6, None))
    pt = p.dep.point  # the row shows what the profile writes (--assume), the range beside it
    samp = {q: bd.sampling_ms(p, q) * t for q in (*bd.POINTS, pt)}
    rows.append(("sampling", samp[pt], (samp["low"], samp["high"])))
    over = {q: e.step_ms.at(q) + e.per_request_us.at(q) * r / 1000.0 for q in (*bd.POINTS, pt)}
    rows.append(("engine overhead", over[pt], (over["low"], over["high"])))
    return rows


def _drafter_row(p: bd.Priced, drafter: Drafter, requests) -> tuple:
    r = np.asarray(requests, dtype=np.float64)
    drafts = {q: draft_ms(p, drafter, r, q) for q in (*bd.POINTS, p.dep.point)}
    dctx = context_us(p, drafter) * r * KV_CTX / 1000.0
    return (f"drafter ({drafter.kind})", drafts[p.dep.point] + dctx,
            (drafts["low"] + dctx, drafts["high"] + dctx))  # fmt: skip


def _table(title: str, heads: list[str], rows: list[tuple], total: str) -> list[str]:
    """Aligned rows with their low-high ranges, and the sum of the mids."""
    lines = [f"  {title:<22}" + "".join(f"{h:>22}" for h in heads)]
    sums = np.zeros(len(heads))
    for name, mid, lohi in rows:
        sums = sums + mid
        cells = [f"{v:.3f}" if lohi is None else f"{v:.3f} ({lo:.3f}-{hi:.3f})"
                 for v, lo, hi in zip(mid, *(lohi or (mid, mid)), strict=True)]  # fmt: skip
        lines.append(f"  {name:<22}" + "".join(f"{c:>22}" for c in cells))
    lines.append(f"  {total:<22}" + "".join(f"{v:>22.3f}" for v in sums))
    return lines


def _kernel_path(p: bd.Priced) -> list[str]:
    """The W4A16 note where FP4 weights (or experts) run dequantised on this GPU."""
    from specsim.sim.cost.operators import W4A16_NOTE

    return [W4A16_NOTE] if paths.w4a16(p, p.bpp) or paths.w4a16(p, p.ebpp) else []


def _latency_assumed(p: bd.Priced) -> list[str]:
    lat = paths.ar_latency(p.dep.gpu)
    if lat is None or p.dep.tp * max(p.dep.ep, 1) <= 1:
        return []
    return [f"all-reduce latency x{lat.low:g}-{lat.high:g} the H100's ({lat.why})"]


LONG_CTX = 32768  # the context the long-context line prices a verify at


def _long_context_line(p: bd.Priced, model: CostModel, k: int) -> str:
    """One sequence's decode attention at a long context: its KV read against its compute at
    1 and k + 1 query tokens (the step pays the longer)."""
    read = model.kv_read_us_per_ktoken * LONG_CTX / 1e6
    comp = [model.attn_us_per_qk_ktoken * q * LONG_CTX / 1e6 for q in (1, k + 1)]
    verdict = "compute-bound" if comp[-1] > read else "memory-bound"
    return (
        f"  attention of one sequence at {LONG_CTX:,} context: KV read {read:.3f} ms, compute "
        f"{comp[0]:.3f} ms at 1 query token"
        + (f", {comp[1]:.3f} ms at {k + 1} (a verify: {verdict})" if k else "")
    )


def _graphs_line(p: bd.Priced, model: CostModel) -> str:
    """Where the captured graphs end (the engine's rule or the user's, with its source) and what
    a step past them adds: the CPU's launches of its kernels (``eager``)."""
    from specsim.sim.cost.eager import kernels, mode_kernels

    e, d = p.eng, p.dep
    n = kernels(d.model, d.tp, d.ep)

    def ms(count: float) -> str:
        lo, at, hi = (count * e.launch_us.at(q) / 1000.0 for q in ("low", d.point, "high"))
        return f"+{at:.1f} ms ({lo:.1f}-{hi:.1f})"

    extra = f", {d.model.extra_kernels:g} a layer FITTED for V4" if d.model.extra_kernels else ""
    if e.graph_mode == "none":
        return (
            f"  CUDA graphs: none ({e.mode_rule}): every step runs eager: {ms(n)}: {n:,.0f} "
            f"kernels launched{extra}, {e.launch_us.at(d.point):g} us each ({e.launch_us.why})"
        )
    uniform, mixed = mode_kernels(p, True), mode_kernels(p, False)
    inside = (
        f"a uniform decode / verify step replays a full graph, {ms(mixed)} for a step holding "
        f"prompt tokens ({mixed:,.0f} launches)" if not uniform
        else f"every step {ms(uniform)} ({uniform:,.0f} launches)"
    )  # fmt: skip
    return (
        f"  CUDA graphs: steps to {model.capture_max_tokens:,} tokens captured ({e.capture_rule}"
        f"{f'; x {d.dp} DP ranks' if d.dp > 1 else ''}); a step past them runs eager: "
        f"{ms(n)}: {n:,.0f} kernels launched{extra}, {e.launch_us.at(d.point):g} us each "
        f"({e.launch_us.why})\n"
        f"  graph mode {e.graph_mode} ({e.mode_rule}): inside the captured sizes {inside}"
    )


def bill(dep: bd.Deployment) -> tuple[CostModel, str]:
    """The profile and the printed bill, in two tables whose columns count what their rows
    price: a decode step without speculation at 1, 64 and 256 requests (one token each), and a
    speculative step of R requests verifying the block (k + 1 tokens each) plus the drafter's
    call for those R requests; a low-high range where a term is assumed."""
    model, p, drafter = build(dep)
    dep = p.dep
    r = np.array(SHOW_TOKENS, dtype=np.float64)
    lines = [f"{model.name}: {model.meta['source']}"]
    if dep.point in CORNERS:
        lines.append(f"  --assume {dep.point}: each assumed term at the end of its range that "
                     f"{'lowers' if dep.point == 'against' else 'raises'} the gain of "
                     "speculation (the profile's); the range beside it")  # fmt: skip
    elif dep.point != "mid":
        lines.append(f"  --assume {dep.point}: each assumed term at its {dep.point} end (the "
                     "profile's); the range beside it")  # fmt: skip
    lines += _table("decode (ms)", [f"{t} req = {t} tok" for t in SHOW_TOKENS],
                    _target_rows(p, model, r, r), f"decode step ({dep.point})")  # fmt: skip
    k = drafter.drafts + drafter.tree_extra  # tokens a request verifies beyond its anchor
    if k:
        reqs = np.array(sorted({max(1, t // (k + 1)) for t in SHOW_TOKENS}), dtype=np.float64)
        toks = reqs * (k + 1)
        verify = _target_rows(p, model, toks, reqs)
        rows = [("target verify", sum(m for _, m, _ in verify), None),
                _drafter_row(p, drafter, reqs)]  # fmt: skip
        heads = [f"{int(q)} req x {k + 1} = {int(t)} tok" for q, t in zip(reqs, toks, strict=True)]
        lines += _table("speculative (ms)", heads, rows, f"speculative step ({dep.point})")
    lines.append(_graphs_line(p, model))
    lines.append(_long_context_line(p, model, k))
    lines.append(
        f"  step table (weights..lm head, padded): 256 vs 1 token x"
        f"{model.step_time(256) / model.step_time(1):.2f}; prefill attention at a 2k prompt "
        f"+{bd.prefill_attention_us_per_token(p, 2048):.2f} us/prompt token (not in the table)"
    )
    drafter_gb = (f" + {p.drafter_weights_gpu / 1e9:.1f} GB drafter"
                  if p.drafter_weights_gpu else "")  # fmt: skip
    lines.append(
        f"  limits: {model.gpus} GPU(s), {p.weights_gpu / 1e9:.1f} GB weights/GPU{drafter_gb}, "
        f"kv_tokens {model.kv_tokens:,}, max_running {model.max_running}, max_batched_tokens "
        f"{model.max_batched_tokens:,}"
    )
    lines.append(f"  measured: {model.meta['operators']}")
    lines.append("  assumed: " + "; ".join(assumptions(p)))
    if p.dep.model.derived:
        lines.append(f"  model facts derived: {p.dep.model.derived}")
    return model, "\n".join(lines)


__all__ = ["assumptions", "bill", "build"]
