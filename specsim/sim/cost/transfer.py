"""Carry a measured step-cost table to another model, GPU count or GPU, with its uncertainty.

Why: the one measured table a capacity planner finds is usually for another deployment (vLLM's
adaptive-verification post measures V4-Flash on 4 B300s and benchmarks V4-Pro on 8). A roofline
from nominal figures misses what the measurement knows (the engine's fixed cost, its real
bandwidth, the CUDA-graph jags); a table used as is misses what the other deployment changes.
This module fits a three-term MoE step model to the measured table, moves each term by the
facts that change it, and keeps the measured shape:

    T(B) = F + W(B) / bw + p * B       (fitted on the captured sizes, NNLS, bw <= nominal)
    W(B) = dense bytes + expert bytes * (1 - (1 - k/E)^B)     per GPU (experts spread evenly)

- ``F`` (ms): the step's fixed cost: per-layer syncs, launches, sampling. Carried by a stated
  rule: ``layers`` (primary: per-layer sync points), ``constant``, ``layers-tp`` (layers, and
  a ring all-reduce's latency growing with the TP size: x (1 + log2(tp_dst / tp_src) / 4)).
- ``W(B) / bw``: weight reads, the distinct experts B tokens touch saturating with B; ``bw`` is
  the fitted effective bandwidth per GPU (scaled by the GPUs' nominal ratio).
- ``p`` (ms per token): everything per token (grouped expert GEMMs, attention, all-to-all).
  ``active`` rule (primary): x (active params per GPU) x (source FLOP/s / target FLOP/s);
  ``width`` rule: x (layers x hidden per GPU), as for activation and all-to-all bytes.
- The measured table's shape is kept as the ratio measured / fitted at every measured size (the
  staircase, the graph-to-eager cliff), applied to the target's model at the same size: inside
  the source's capture sizes the graph ratio, past the target's capture limit the source's
  eager ratio, in between (sizes the target captures and the source did not) none.

The drafter (its own table, by requests): ``D(R) = d0 + d1 R`` fitted linearly; ``d0`` kept
(a fixed number of small kernels), ``d1`` x (hidden ratio)^2 x (source GPUs / target GPUs) (a
drafter as wide as its target, sharded like it; primary), or x hidden ratio (LM-head and
sampling bound), or x (hidden ratio)^2 unsharded.

:func:`transfer_range` runs every combination and returns the low, primary and high tables:
the uncertainty a planner should read next to any prediction made from one of them.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

import numpy as np

from specsim.errors import SpecsimError
from specsim.sim.cost.accelerators import Accelerator
from specsim.sim.cost.deployments import ModelFacts
from specsim.sim.cost.model import CostModel

FIXED_RULES = ("layers", "constant", "layers-tp")
TOKEN_RULES = ("active", "width")
DRAFT_RULES = ("sharded", "linear", "unsharded")


@dataclass(frozen=True)
class Layout:
    """A model served on ``gpus`` GPUs of one kind (tensor and expert parallel over all of them)."""

    model: ModelFacts
    gpu: Accelerator
    gpus: int
    precision: str = "fp8"  # the GEMMs' precision: its FLOP/s scale the per-token term
    capture_max_tokens: int = 1024  # the engine's largest CUDA-graph capture size

    def __post_init__(self) -> None:
        if self.gpus < 1 or self.capture_max_tokens < 1:
            raise SpecsimError("a layout needs gpus >= 1 and capture_max_tokens >= 1")

    @property
    def dense_bytes(self) -> float:
        """Bytes of the parameters every token reads (attention, shared experts, embeddings):
        the non-expert parameters at one byte each (FP8), as the released checkpoints keep them."""
        m = self.model
        return (1.0 - m.expert_share) * float(m.total_params) * 1.0

    @property
    def expert_bytes(self) -> float:
        """The rest of the checkpoint: routed experts (FP4 with scales in V4's checkpoints)."""
        return max(float(self.model.download_bytes) - self.dense_bytes, 0.0)

    def weight_gb_per_gpu(self, batch) -> np.ndarray:  # type: ignore[no-untyped-def]
        """GB each GPU reads in a step of ``batch`` tokens: its share of the dense weights and of
        the experts those tokens touch (uniform routing, experts spread evenly)."""
        b = np.maximum(np.asarray(batch, dtype=np.float64), 1.0)
        e, k = float(self.model.routed_experts), float(self.model.top_k)
        touched = 1.0 - (1.0 - k / e) ** b
        return (self.dense_bytes + self.expert_bytes * touched) / self.gpus / 1e9

    @property
    def active_per_gpu(self) -> float:
        return float(self.model.active_params) / self.gpus

    @property
    def width_per_gpu(self) -> float:
        return float(self.model.layers) * float(self.model.hidden) / self.gpus


@dataclass(frozen=True)
class StepFit:
    """``T(B) = fixed_ms + weight_gb(B) * ms_per_gb + ms_per_token * B`` on a layout."""

    fixed_ms: float
    ms_per_gb: float
    ms_per_token: float

    def predict(self, layout: Layout, batch) -> np.ndarray:  # type: ignore[no-untyped-def]
        b = np.asarray(batch, dtype=np.float64)
        return self.fixed_ms + layout.weight_gb_per_gpu(b) * self.ms_per_gb + self.ms_per_token * b

    @property
    def bandwidth_tb_s(self) -> float:
        """The effective weight-read bandwidth per GPU the fit implies."""
        return 1.0 / self.ms_per_gb if self.ms_per_gb > 0 else math.inf


def fit_step(measured: CostModel, layout: Layout) -> StepFit:
    """Non-negative least squares of the three terms on the measured sizes inside the capture
    limit (eager sizes follow another regime and are carried by their ratio instead)."""
    from scipy.optimize import nnls

    b = measured.batch_tokens.astype(np.float64)
    ms = np.asarray(measured.step_ms, dtype=np.float64)
    if ms.ndim != 1:
        raise SpecsimError("transfer needs a 1-D measured table (tokens -> ms)")
    keep = b <= layout.capture_max_tokens
    if keep.sum() < 3:
        raise SpecsimError("transfer needs at least 3 measured sizes inside the capture limit")
    gb = layout.weight_gb_per_gpu(b[keep])
    floor = 1e3 / float(layout.gpu.mem_bw) * 1e9  # ms per GB at the nominal bandwidth
    x = np.stack([np.ones(keep.sum()), gb, b[keep]], axis=1)
    # no kernel reads faster than the HBM's nominal bandwidth: ms_per_gb = floor + z, z >= 0;
    # relative errors (each row divided by its measurement), so small steps weigh as much
    w = 1.0 / ms[keep]
    coef, _ = nnls(x * w[:, None], (ms[keep] - floor * gb) * w)
    return StepFit(float(coef[0]), floor + float(coef[1]), float(coef[2]))


def _carry(fit: StepFit, src: Layout, dst: Layout, fixed_rule: str, token_rule: str) -> StepFit:
    if fixed_rule not in FIXED_RULES or token_rule not in TOKEN_RULES:
        raise SpecsimError(
            f"unknown transfer rule {fixed_rule!r}/{token_rule!r}; fixed: {', '.join(FIXED_RULES)}"
            f", per token: {', '.join(TOKEN_RULES)}"
        )
    layers = float(dst.model.layers) / float(src.model.layers)
    fixed = fit.fixed_ms * (1.0 if fixed_rule == "constant" else layers)
    if fixed_rule == "layers-tp":
        fixed *= 1.0 + math.log2(dst.gpus / src.gpus) / 4.0
    bw = float(src.gpu.mem_bw) / float(dst.gpu.mem_bw)
    if token_rule == "active":
        per_tok = dst.active_per_gpu / src.active_per_gpu
        per_tok *= src.gpu.flops(src.precision) / dst.gpu.flops(dst.precision)
    else:
        per_tok = dst.width_per_gpu / src.width_per_gpu
    return StepFit(fixed, fit.ms_per_gb * bw, fit.ms_per_token * per_tok)


def _ratio(measured: CostModel, fit: StepFit, src: Layout, batch: np.ndarray, dst: Layout):  # type: ignore[no-untyped-def]
    """The measured / fitted shape carried to the target's sizes (see the module docstring)."""
    b = measured.batch_tokens
    ratio = np.asarray(measured.step_ms, dtype=np.float64) / fit.predict(src, b)
    graph = b <= src.capture_max_tokens
    out = np.ones_like(batch, dtype=np.float64)
    if graph.any():  # the staircase of the source's graphs, at or above each size
        gb, gr = b[graph], ratio[graph]
        inside = batch <= gb[-1]
        idx = np.minimum(np.searchsorted(gb, batch[inside], side="left"), gb.size - 1)
        out[inside] = gr[idx]
    if (~graph).any():  # the source's eager regime, where the target runs eager too
        eb, er = b[~graph], ratio[~graph]
        eager = batch > dst.capture_max_tokens
        out[eager] = np.interp(batch[eager], eb, er)
    return out


def transfer(
    measured: CostModel,
    src: Layout,
    dst: Layout,
    *,
    fixed_rule: str = "layers",
    token_rule: str = "active",
    draft_rule: str = "sharded",
    name: str | None = None,
    b_max: int = 16384,
) -> CostModel:
    """``measured`` (a table of ``src``) carried to ``dst`` by the named rules: a step-read
    profile at ``dst``'s capture sizes (vLLM's defaults up to its capture limit) and every 64
    tokens past them up to ``b_max``, and the drafter's curve carried by ``draft_rule`` when
    ``measured`` has one."""
    fit = fit_step(measured, src)
    to = _carry(fit, src, dst, fixed_rule, token_rule)
    from specsim.sim.cost.profile_export import vllm_capture_sizes

    cap = min(dst.capture_max_tokens, b_max)
    sizes = [*vllm_capture_sizes(cap), *range(cap - cap % 64 + 64, b_max + 1, 64)]
    batch = np.array(sorted(set(sizes)), dtype=np.float64)
    ms = to.predict(dst, batch) * _ratio(measured, fit, src, batch, dst)
    curve = measured.draft_curve
    if curve:
        curve = carry_draft(curve, src, dst, draft_rule)
    meta = {
        **measured.meta,
        "source": f"{measured.name} ({measured.meta.get('source', '')}) carried from "
        f"{src.model.name} on {src.gpus}x{src.gpu.name} to {dst.model.name} on "
        f"{dst.gpus}x{dst.gpu.name} by specsim.sim.cost.transfer",
        "transfer": f"fixed {fixed_rule}, per token {token_rule}, draft {draft_rule}",
        "fit": f"F {fit.fixed_ms:.3f} ms, bw {fit.bandwidth_tb_s:.2f} TB/s per GPU, "
        f"p {fit.ms_per_token * 1000:.2f} us/token (source); target F {to.fixed_ms:.3f} ms, "
        f"p {to.ms_per_token * 1000:.2f} us/token",
    }
    return replace(
        measured,
        name=name or f"{measured.name}->{dst.model.name}x{dst.gpus}",
        batch_tokens=batch.astype(np.int64),
        step_ms=ms,
        context_tokens=None,
        draft_curve=curve,
        interpolation="step",  # the target's graphs: a batch pays its next capture size
        capture_max_tokens=cap,
        gpus=dst.gpus,
        meta=meta,
    )


def carry_draft(
    curve: tuple[tuple[int, float], ...], src: Layout, dst: Layout, rule: str = "sharded"
) -> tuple[tuple[int, float], ...]:
    """The drafter's (requests, ms) curve carried to ``dst``: ``d0 + d1 R`` fitted, ``d0``
    kept, ``d1`` scaled by the rule (module docstring); tabulated at the source's sizes."""
    if rule not in DRAFT_RULES:
        raise SpecsimError(f"unknown draft rule {rule!r}; use one of {', '.join(DRAFT_RULES)}")
    r = np.array([x for x, _ in curve], dtype=np.float64)
    ms = np.array([y for _, y in curve], dtype=np.float64)
    d1, d0 = np.polyfit(r, ms, 1) if r.size > 1 else (0.0, float(ms[0]))
    d0, d1 = max(float(d0), 0.0), max(float(d1), 0.0)
    h = float(dst.model.hidden) / float(src.model.hidden)
    shard = src.gpus / dst.gpus
    scale = {"sharded": h * h * shard, "linear": h * shard, "unsharded": h * h}[rule]
    resid = ms - (d0 + d1 * r)  # the measured jags, kept in absolute ms
    return tuple(
        (int(x), float(max(d0 + d1 * scale * x + e, 1e-6))) for x, e in zip(r, resid, strict=True)
    )


def transfer_range(
    measured: CostModel, src: Layout, dst: Layout, *, b_max: int = 16384
) -> tuple[CostModel, CostModel, CostModel]:
    """(low, primary, high): the primary rules' table and the pointwise minimum and maximum
    step (and draft) cost over every combination of fixed, per-token and draft rules."""
    prim = transfer(measured, src, dst, b_max=b_max)
    tables = [
        transfer(measured, src, dst, fixed_rule=f, token_rule=t, draft_rule=d, b_max=b_max)
        for f, t, d in itertools.product(FIXED_RULES, TOKEN_RULES, DRAFT_RULES)
    ]
    steps = np.stack([t.step_ms for t in tables])
    out = []
    for tag, fn in (("low", np.min), ("high", np.max)):
        curve = prim.draft_curve
        if curve:
            dr = np.stack([[m for _, m in t.draft_curve] for t in tables])
            curve = tuple(
                (r, float(v)) for (r, _), v in zip(prim.draft_curve, fn(dr, axis=0), strict=True)
            )
        meta = {**prim.meta, "transfer": f"{tag} over every rule combination"}
        out.append(replace(prim, name=f"{prim.name}:{tag}", step_ms=fn(steps, axis=0),
                           draft_curve=curve, meta=meta))  # fmt: skip
    return out[0], prim, out[1]


__all__ = [
    "DRAFT_RULES",
    "FIXED_RULES",
    "TOKEN_RULES",
    "Layout",
    "StepFit",
    "carry_draft",
    "fit_step",
    "transfer",
    "transfer_range",
]
