"""Cost profiles: CSV files (measured or generated) and a roofline generator, found by name.

Profile CSV format (docs/simulator.md): optional header lines ``# key: value`` holding the scalar
costs (``draft_base_ms``, ``draft_per_request_ms``, ``draft_per_token_ms``, ``sched_base_us``,
``sched_us_per_request``, ``max_running``, ``kv_tokens``, ``max_batched_tokens``, and the measured
engine terms ``step_overhead_ms``, ``verify_per_request_ms``, ``draft_per_context_us``,
``draft_context_window``, ``prefill_token_ms`` (specsim.sim.cost.model); anything else is kept as
metadata),
then a table with columns ``batch_tokens,step_ms`` and optionally ``context_tokens`` (a full
grid: every batch size at every context).

Built-in names: the generated ``h100-dense-8b`` and ``v4-flash-like`` (roofline, calibrated in
docs/simulator.md), ``v4-pro-like`` (built from the sourced facts of
``specsim.sim.cost.deployments``), the measured ``vllm-v4-flash-tp4-b300`` (vLLM's published tables)
and every ``specsim/data/profiles/*.csv`` by its file stem.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

import numpy as np

from specsim.errors import SpecsimError
from specsim.registry import Registry
from specsim.sim.cost.all_to_all import sources
from specsim.sim.cost.deployments import Deployment, FreeParams
from specsim.sim.cost.model import CostModel
from specsim.sim.cost.profile_csv import (  # noqa: F401 - re-exported: the CSV half of profiles
    format_curve,
    parse_curve,
    parse_profile_csv,
    read_profile_csv,
    write_profile_csv,
)

PROFILES: Registry[CostModel] = Registry("profile")

# --------------------------------------------------------------------------- roofline


@dataclass(frozen=True)
class Hardware:
    """A serving node. Rates are the node's totals, already derated to what kernels reach."""

    name: str
    mem_bw: float  # bytes/s of HBM bandwidth reached
    flops: float  # FLOP/s reached on the step's matmuls
    overhead_ms: float  # fixed per step: launch, sync, sampling, framework
    per_token_us: float = 0.0  # per padded token not captured above (all-to-all, sampling)


@dataclass(frozen=True)
class ModelSpec:
    """A target model. ``experts`` = 0 for a dense model."""

    name: str
    params: float  # total parameters
    active_params: float  # parameters one token touches
    bytes_per_param: float = 2.0
    experts: int = 0  # routed experts per MoE layer
    top_k: int = 0
    expert_share: float = 0.0  # share of ``params`` that sits in routed experts
    kv_bytes_per_token: float = 0.0  # KV bytes of one cached token (all layers)


def distinct_experts(batch, experts: int, top_k: int):
    """Expected distinct experts touched by B tokens each routed to top_k of E (uniform):
    E * (1 - (1 - k/E)^B)."""
    b = np.asarray(batch, dtype=np.float64)
    return experts * (1.0 - (1.0 - top_k / experts) ** b)


def cuda_graph_buckets(max_graph: int = 512) -> np.ndarray:
    """vLLM-like captured batch sizes: 1, 2, 4, 8, 16, ..., 248 by 8, then by 16 to max_graph."""
    small = [1, 2, 4]
    return np.array(
        small + list(range(8, 256, 8)) + list(range(256, max_graph + 1, 16)), dtype=np.int64
    )


def pad_batch(batch, buckets: np.ndarray, eager_multiple: int = 64):
    """B rounded up to the next bucket; beyond the largest, to a multiple of ``eager_multiple``."""
    b = np.asarray(batch, dtype=np.int64)
    idx = np.searchsorted(buckets, b, side="left")
    inside = idx < buckets.size
    eager = -(-b // eager_multiple) * eager_multiple
    return np.where(inside, buckets[np.minimum(idx, buckets.size - 1)], eager)


def roofline_ms(batch, hw: Hardware, model: ModelSpec, buckets: np.ndarray | None = None):
    """Step milliseconds at token batch B: overhead + max(memory, compute) + per-token work.

    Memory: dense weights + touched experts (``distinct_experts`` of the padded batch); the KV
    is not in the table (each sequence's, at its own context: ``kv_read_us_per_ktoken``).
    Compute: 2 * active params per padded token. Padding to CUDA-graph buckets makes the curve
    step-shaped.
    """
    buckets = cuda_graph_buckets() if buckets is None else buckets
    bp = pad_batch(np.maximum(np.asarray(batch, dtype=np.int64), 1), buckets).astype(np.float64)
    weight_bytes = model.params * model.bytes_per_param
    if model.experts:
        expert_bytes = weight_bytes * model.expert_share
        touched = distinct_experts(bp, model.experts, model.top_k) / model.experts
        weight_read = (weight_bytes - expert_bytes) + expert_bytes * touched
    else:
        weight_read = np.full_like(bp, weight_bytes)
    mem_s = weight_read / hw.mem_bw
    comp_s = 2.0 * model.active_params * bp / hw.flops
    return hw.overhead_ms + 1000.0 * np.maximum(mem_s, comp_s) + hw.per_token_us * bp / 1000.0


def roofline_profile(
    name: str,
    hw: Hardware,
    model: ModelSpec,
    *,
    b_max: int = 8192,
    **scalars,
) -> CostModel:
    """A CostModel tabulated from the roofline at every B = 1..b_max (keeps every jag).

    The serving model reads the KV of each sequence in a step at its own context: the table
    covers weights and compute only, and ``kv_read_us_per_ktoken`` (the model's KV bytes per
    token over the memory bandwidth) is charged per cached token of every sequence in the step
    (additive: exact where the step is memory-bound, which is where KV matters; an
    over-estimate by at most the KV time where it is compute-bound). Serving model v1 folded
    the KV of B / 4 sequences at a fixed context into the table instead (retired: it runs at
    commit 77e1490).
    """
    batch = np.arange(1, b_max + 1)
    meta = {
        "source": f"roofline: {hw.name} x {model.name}",
        "kv_read": "per sequence at its own context (kv_read_us_per_ktoken)",
    }
    kv_us = model.kv_bytes_per_token * 1000.0 / hw.mem_bw * 1e6
    return CostModel(
        name=name,
        batch_tokens=batch,
        step_ms=roofline_ms(batch, hw, model),
        meta=meta,
        kv_read_us_per_ktoken=kv_us,
        **scalars,
    )


# H100 SXM: 3.35 TB/s HBM3, 989 TFLOP/s dense bf16; we assume 80% and 60% reached.
H100 = Hardware("H100-SXM", mem_bw=0.80 * 3.35e12, flops=0.60 * 989e12, overhead_ms=1.0)
# Llama-3-8B-like: 8.03B params bf16; GQA 32 layers x 8 KV heads x 128 x (K,V) x 2 bytes.
DENSE_8B = ModelSpec("dense-8B-bf16", 8.03e9, 8.03e9, 2.0, kv_bytes_per_token=131072.0)

# A DeepSeek-V4-Flash-like MoE served on one 8-GPU node of "production" (H20-class) GPUs:
# 8 x 4.0 TB/s and 8 x 296 TFLOP/s fp8 nominal. The per-token term folds in what the roofline
# misses (expert all-to-all, attention over long contexts, the serial sampling loop); it and the
# fixed overhead are calibrated to the paper's production SLA regime (MTP-1 just reaches ~120
# tok/s/user at low load; docs/simulator.md explains why not the 188-190 ms microbenchmark).
V4_NODE = Hardware(
    "8xH20-class",
    mem_bw=0.75 * 8 * 4.0e12,
    flops=0.45 * 8 * 296e12,
    overhead_ms=10.0,
    per_token_us=20.0,
)
V4_FLASH_MOE = ModelSpec(
    "v4-flash-like-moe-fp8",
    params=284e9,
    active_params=13e9,
    bytes_per_param=1.0,
    experts=256,
    top_k=6,
    expert_share=0.95,
    kv_bytes_per_token=70_000.0,  # compressed (MLA-style) latent KV
)


@PROFILES.register("h100-dense-8b", help="roofline: dense 8B bf16 on one H100 (generated)")
@functools.cache
def _h100_dense_8b(arg: str | None = None) -> CostModel:
    return roofline_profile(
        "h100-dense-8b",
        H100,
        DENSE_8B,
        b_max=65536,
        draft_base_ms=0.35,
        draft_per_request_ms=0.004,
        draft_per_token_ms=0.0015,
        # a 2-layer drafter of the target's width (~0.45B parameters) prefilling a prompt
        # token: 2 x 0.45e9 FLOP at the derated 593 TFLOP/s
        draft_prefill_us_per_token=1.5,
        sched_base_us=30.0,
        sched_us_per_request=0.8,
        max_running=256,
        kv_tokens=430_000,
    )


@PROFILES.register("v4-flash-like", help="roofline: V4-Flash-like MoE on an 8-GPU node")
@functools.cache
def _v4_flash_like(arg: str | None = None) -> CostModel:
    return roofline_profile(
        "v4-flash-like",
        V4_NODE,
        V4_FLASH_MOE,
        b_max=65536,
        draft_base_ms=2.0,
        draft_per_request_ms=0.02,
        draft_per_token_ms=0.005,
        # a 5-layer drafter of width 4096 (~1B parameters) prefilling a prompt token at the
        # node's derated 1.07 PFLOP/s
        draft_prefill_us_per_token=2.0,
        sched_base_us=60.0,
        sched_us_per_request=2.0,
        max_running=512,
        kv_tokens=4_000_000,
        gpus=8,
    )


def deployment_profile(
    name: str,
    dep: Deployment,
    fit: FreeParams,
    *,
    bytes_per_param: float | None = None,
    buckets: np.ndarray | None = None,
    max_running: int | None = None,
    draft_scale: float = 1.0,
    sched_scale: float = 1.0,
    kv_scale: float = 1.0,
    a2a_scale: float = 1.0,
    floor_us_per_layer: float | None = None,
    b_max: int = 65536,
) -> CostModel:
    """A roofline profile of a sourced :class:`~specsim.sim.cost.deployments.Deployment`.

    Every physical input comes from ``dep`` (its header lists each with its source); only
    ``fit`` (fixed and per-token overheads) is free. On top of the fit come the two derived
    expert all-to-all terms (``all_to_all``): the bandwidth cost per padded token and, only when
    ``dep`` spans nodes, the cross-node latency floor per step; so ``v4-pro-like`` and the paper
    check's prediction are the same profile. The keyword arguments exist for the sensitivity
    study of the retired paper check, reports/paper-check (FP8 instead of the
    checkpoint's bytes per parameter, other CUDA-graph buckets, another batch cap or KV capacity,
    scaled draft/scheduler costs, the all-to-all's bandwidth term scaled, another floor per MoE
    layer). Draft and scheduler costs are v4-flash-like's, the per-request/per-token draft terms
    scaled by (hidden / 4096)^2 (a drafter as wide as its target).
    """
    from specsim.sim.cost.all_to_all import all_to_all

    m = dep.model
    g = dep.gpu
    a2a = all_to_all(dep)
    floor_us = a2a.floor_us_per_layer
    if floor_us_per_layer is not None and a2a.floor_us_per_layer > 0:
        floor_us = float(floor_us_per_layer)  # an override applies only across nodes too
    floor_ms = floor_us * a2a.layers / 1000.0
    a2a_us = a2a_scale * a2a.total_us
    hw = Hardware(
        f"{dep.gpus}x{g.name}",
        mem_bw=float(dep.mem_derate) * dep.gpus * float(g.mem_bw),
        flops=float(dep.flops_derate) * dep.gpus * float(g.flops),
        overhead_ms=fit.overhead_ms + floor_ms,
        per_token_us=fit.per_token_us + a2a_us,
    )
    bpp = m.bytes_per_param if bytes_per_param is None else float(bytes_per_param)
    spec = ModelSpec(
        f"{m.name}-{bpp:.2f}B",
        params=float(m.total_params),
        active_params=float(m.active_params),
        bytes_per_param=bpp,
        experts=int(float(m.routed_experts)),
        top_k=int(float(m.top_k)),
        expert_share=m.expert_share,
        kv_bytes_per_token=m.kv_bytes_per_token,
    )
    batch = np.arange(1, b_max + 1)
    ms = roofline_ms(batch, hw, spec, buckets=buckets)  # the KV: read per sequence
    width2 = (float(m.hidden) / 4096.0) ** 2
    meta = {"source": f"roofline: {hw.name} x {spec.name} (specsim/sim/cost/deployments.py)"}
    meta.update(sources(dep))
    meta["overhead_ms"] = f"{fit.overhead_ms:g} (free: {fit.source})"
    meta["per_token_us"] = f"{fit.per_token_us:g} (free: {fit.source})"
    if a2a_scale != 1.0:
        meta["a2a_per_token_us"] = f"{a2a_us:.3f} (x{a2a_scale:g}: {meta['a2a_per_token_us']})"
    if floor_us != a2a.floor_us_per_layer:
        meta["a2a_floor_ms"] = f"{floor_ms:.3f} (override: {floor_us:g} us per MoE layer)"
    meta["step_fixed_ms"] = f"{hw.overhead_ms:.3f} (overhead_ms + a2a_floor_ms)"
    meta["step_per_token_us"] = f"{hw.per_token_us:.3f} (per_token_us + a2a_per_token_us)"
    common = dict(
        name=name,
        batch_tokens=batch,
        draft_base_ms=2.0 * draft_scale,
        draft_per_request_ms=0.02 * width2 * draft_scale,
        draft_per_token_ms=0.005 * width2 * draft_scale,
        sched_base_us=60.0 * sched_scale,
        sched_us_per_request=2.0 * sched_scale,
        max_running=int(float(dep.max_running)) if max_running is None else int(max_running),
        kv_tokens=min(int(dep.kv_tokens * kv_scale), 10**12),
        gpus=dep.gpus,
    )
    return CostModel(
        step_ms=ms,
        meta={**meta, "kv_read": "per sequence at its own context (kv_read_us_per_ktoken)"},
        kv_read_us_per_ktoken=m.kv_bytes_per_token * 1000.0 / hw.mem_bw * 1e6,
        draft_prefill_us_per_token=2.0 * width2 * draft_scale,
        **common,
    )


@PROFILES.register(
    "v4-pro-like", help="roofline: V4-Pro from public facts on 16 GPUs (paper-check fit)"
)
@functools.cache
def _v4_pro_like(arg: str | None = None) -> CostModel:
    from specsim.sim.cost.deployments import FLASH_FIT, PRO_DEPLOYMENT, transfer

    return deployment_profile(
        "v4-pro-like", PRO_DEPLOYMENT, transfer(FLASH_FIT, PRO_DEPLOYMENT.model)
    )


@PROFILES.register(
    "vllm-v4-flash-tp4-b300",
    help="measured: vLLM's adaptive-verification tables, V4-Flash TP4 on B300",
)
@functools.cache
def _vllm_v4_flash_tp4_b300(arg: str | None = None) -> CostModel:
    """vLLM's published startup profile (fig. 2 of its adaptive-verification post), read as vLLM
    reads it: running maximum, a staircase to the 1,024-token capture limit, eager past it.

    What the post does not give is assumed and said so: 256 running requests (its benchmark's
    largest concurrency), a KV cache of 4M tokens (4 x 288 GB of B300 HBM less the checkpoint:
    not a limit at that concurrency) and vLLM's default 8,192 batched tokens a step.
    """
    from specsim.sim.cost.profile_import import from_vllm_adaptive

    folder = resources.files("specsim") / "data" / "published" / "vllm-adaptive-verification"
    model = from_vllm_adaptive(
        str(folder / "verify_cost.csv"),
        str(folder / "draft_cost.csv"),
        name="vllm-v4-flash-tp4-b300",
        max_running=256,
        kv_tokens=4_000_000,
        gpus=4,
    )
    model.meta["source"] = (
        "vLLM blog 'Adaptive Verification in vLLM' (2026-08-14), fig. 2: DeepSeek-V4-Flash-0731, "
        "TP=4 on B300, 440 profiled steps (specsim/data/published/vllm-adaptive-verification)"
    )
    model.meta["assumed"] = "max_running 256, kv_tokens 4,000,000 (not in the post)"
    return model


def register_csv_folder(folder=None) -> list[str]:
    """Register every ``*.csv`` in ``folder`` (default: ``specsim/data/profiles/``) under its
    file stem; names already taken are left alone. Returns the names added."""
    try:
        if folder is None:
            folder = resources.files("specsim") / "data" / "profiles"
        entries = sorted(folder.iterdir(), key=lambda e: e.name) if folder.is_dir() else []
    except (FileNotFoundError, ModuleNotFoundError):
        entries = []
    added = []
    for entry in entries:
        if not entry.name.endswith(".csv"):
            continue
        stem = entry.name[:-4]
        if stem in PROFILES:
            continue

        def factory(arg: str | None = None, _e=entry, _s=stem) -> CostModel:
            return parse_profile_csv(_e.read_text(), _s, source=str(_e))

        PROFILES.register(stem, help=f"profile CSV {entry.name}")(factory)
        added.append(stem)
    return added


register_csv_folder()


SCHED_SUFFIX = "@sched-x"


def scaled_profile_name(profile: str, scale: float) -> str:
    """``v4-flash-like@sched-x10``: the profile with its scheduler compute cost times 10."""
    return f"{profile}{SCHED_SUFFIX}{scale:g}"


def _sched_scaled(spec: str) -> CostModel:
    """``NAME@sched-xS``: the profile NAME with the scheduler's compute cost (base and per
    request) times S. A suffix, not a file, so a sweep row's profile string replays on its own
    (the cell key is the spec) without writing megabytes of profile CSV."""
    name, _, scale_text = spec.partition(SCHED_SUFFIX)
    try:
        scale = float(scale_text)
    except ValueError:
        scale = float("nan")
    if not (scale >= 0 and scale < float("inf")):
        raise SpecsimError(
            f"profile {spec!r}: the number after {SCHED_SUFFIX} must be a scale >= 0, e.g. "
            f"{name}{SCHED_SUFFIX}10"
        )
    base = get_profile(name)
    return replace(
        base,
        name=spec,
        sched_base_us=base.sched_base_us * scale,
        sched_us_per_request=base.sched_us_per_request * scale,
    )


def get_profile(spec: str | CostModel | os.PathLike) -> CostModel:
    """A built-in name, a path to a profile CSV, or a CostModel (returned as is); either name
    may end in ``@sched-xS`` (scheduler compute cost times S)."""
    if isinstance(spec, CostModel):
        return spec
    s = str(spec)
    if SCHED_SUFFIX in s:
        return _sched_scaled(s)
    if s.endswith(".csv") or os.sep in s or Path(s).is_file():
        return read_profile_csv(s)
    if s in PROFILES:
        return PROFILES.get(s)
    if Path(s).is_dir():  # a folder is a path too: the reader says what to pass instead
        return read_profile_csv(s)
    close = [n for n in PROFILES.names() if n.startswith(s[:3])]
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise SpecsimError(
        f"unknown profile {s!r}{hint}; valid names: {', '.join(PROFILES.names())}, "
        "or a path to a profile CSV"
    )


def describe(model: CostModel) -> str:
    """One line per key point of a profile, for docs and the CLI."""
    pts = [1, 8, 64, 128, 256, 512, 640, 1024, 2048]
    cells = [f"B={b}: {model.step_time(b) * 1000:.2f} ms" for b in pts]
    return f"{model.name}: " + ", ".join(cells) + f"; knee/bmax {model.b_max}"


__all__ = [
    "PROFILES",
    "CostModel",
    "Hardware",
    "ModelSpec",
    "cuda_graph_buckets",
    "deployment_profile",
    "describe",
    "distinct_experts",
    "get_profile",
    "pad_batch",
    "parse_profile_csv",
    "read_profile_csv",
    "register_csv_folder",
    "roofline_ms",
    "roofline_profile",
    "scaled_profile_name",
    "write_profile_csv",
]
