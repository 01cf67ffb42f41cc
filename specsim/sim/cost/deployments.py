"""Sourced deployment models of DeepSeek V4-Flash and V4-Pro (``specsim report real-deployments``;
first built for the retired paper check, reports/real-deployments/paper-check).

Why a module of facts: the DSpark paper's production table (V4-Flash +51% / +661% and V4-Pro
+52% / +406% throughput over MTP-1 at two per-user SLAs each) is the one published measurement
of prefix scheduling at scale. To test the simulator against it, the two cost profiles must come
from public facts, each with its source, so that a prediction for V4-Pro made from a fit on
V4-Flash is a prediction and not a second fit. Every number here is a :class:`Fact` (value +
citation); :class:`FreeParams` are what physical facts leave open, fitted on V4-Flash only.

This module is pure data and arithmetic: it imports nothing from the simulator, so
``specsim.sim.cost.profiles`` can build profiles from it (``deployment_profile``) without an import
cycle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

# Short citation strings, reused below.
HF_FLASH = "deepseek-ai/DeepSeek-V4-Flash model card (Hugging Face)"
HF_PRO = "deepseek-ai/DeepSeek-V4-Pro model card (Hugging Face)"
NEMO_FLASH = "NVIDIA NeMo AutoModel, DeepSeek-V4-Flash page / DeepseekV4Config defaults"
V4_REPORT = "DeepSeek-V4 technical report (compressed attention: KV at 1M ~10% of V3.2)"
V32_CONFIG = "DeepSeek-V3.2 config.json: 61 layers, MLA latent 512 + rope 64, bf16"
V3_REPORT = "DeepSeek-V3 technical report, section 5.4.3 (MTP second-token acceptance 85-90%)"
DSPARK = (
    "DSpark paper, production results (DeepSeek, 2026: DSpark_paper.pdf in "
    "github.com/deepseek-ai/DeepSpec)"
)
H20_SPEC = "NVIDIA H20 datasheet: 96 GB HBM3, 4.0 TB/s, 296 TFLOP/s FP8 dense"
PROFILE_ASSUMPTION = "specsim v4-flash-like assumption (docs/simulator.md), not a public fact"
DEEPEP = (
    "DeepEP README, V1 performance (docs/legacy.md): H800 (~160 GB/s NVLink) + one CX7 400 Gb/s "
    "InfiniBand NIC per GPU (~50 GB/s); FP8 dispatching, BF16 combining"
)
V3_COMM = (
    "DeepSeek-V3 technical report, 3.2.2 (IB 50 GB/s per GPU, NVLink 160 GB/s on H800) and "
    "3.3.3 (dispatch activations in FP8 with 1x128 scales, combine in BF16)"
)
H800_SPEC = (
    "NVIDIA H100 SXM datasheet (H800 SXM: same memory and compute, NVLink cut to 400 GB/s): "
    "80 GB HBM3, 3.35 TB/s, 1,979 TFLOP/s FP8 dense"
)
H20_NVLINK = "NVIDIA H20 spec: NVLink 4.0, 900 GB/s bidirectional (450 GB/s each way)"
DEEPEP_LL = (
    "DeepEP docs/legacy.md (the V1 README), 'Low-latency kernels with pure RDMA' "
    "(https://github.com/deepseek-ai/DeepEP/blob/main/docs/legacy.md): H800 + one CX7 400 Gb/s "
    "NIC per GPU, 128 tokens per batch, hidden 7168, top-8, FP8 dispatch / BF16 combine; "
    "latency by EP size"
)


@dataclass(frozen=True)
class Fact:
    """A number and where it comes from (a short citation)."""

    value: float
    source: str

    def __float__(self) -> float:
        return float(self.value)


@dataclass(frozen=True)
class ModelFacts:
    """Public facts of one target model."""

    name: str
    total_params: Fact
    active_params: Fact
    routed_experts: Fact
    top_k: Fact
    shared_experts: Fact
    layers: Fact
    hidden: Fact
    context: Fact
    download_bytes: Fact  # the released checkpoint (FP4 experts + FP8 rest)
    kv_ratio_vs_v32: Fact  # KV per token at 1M context relative to DeepSeek-V3.2

    @property
    def bytes_per_param(self) -> float:
        """Checkpoint bytes / total parameters: ~0.56 for FP4 experts + FP8 rest (FP8 = 1.0)."""
        return float(self.download_bytes) / float(self.total_params)

    @property
    def expert_share(self) -> float:
        """Share s of the parameters in routed experts, from active = (1 - s) P + s P k / E."""
        p, a = float(self.total_params), float(self.active_params)
        k_over_e = float(self.top_k) / float(self.routed_experts)
        return (p - a) / (p * (1.0 - k_over_e))

    @property
    def kv_bytes_per_token(self) -> float:
        """V3.2's MLA KV (576 bf16 values per layer) x this model's layers x the V4 ratio."""
        return V32_KV_BYTES_PER_LAYER * float(self.layers) * float(self.kv_ratio_vs_v32)


V32_KV_BYTES_PER_LAYER = (512 + 64) * 2  # MLA latent + decoupled rope key, bf16 (V32_CONFIG)


@dataclass(frozen=True)
class GpuFacts:
    """One accelerator, nominal (the node's totals are x ``per_node``)."""

    name: str
    hbm_bytes: Fact
    mem_bw: Fact  # bytes/s
    flops: Fact  # FLOP/s at the weights' compute precision (FP8 on Hopper; no FP4 units)
    per_node: Fact


@dataclass(frozen=True)
class FabricFacts:
    """The links an expert-parallel all-to-all crosses, and what one token puts on them.

    Bandwidths are per GPU and per direction: inside a node every GPU reaches the others over
    NVLink; between nodes each GPU has its own NIC (the HGX layout DeepEP and DeepSeek-V3
    describe). Byte widths are per hidden value: dispatch in FP8 plus one FP32 scale per 128
    values, combine in BF16.
    """

    nvlink_bw: Fact  # bytes/s, one direction
    nic_bw: Fact  # bytes/s, one direction
    dispatch_bytes: Fact  # per hidden value
    dispatch_scale_bytes: Fact  # per ``scale_block`` hidden values
    scale_block: Fact
    combine_bytes: Fact  # per hidden value
    ll_bench: LowLatencyBench  # DeepEP's published decode all-to-all latencies (the floor)


@dataclass(frozen=True)
class LowLatencyBench:
    """DeepEP's published low-latency (decode) dispatch / combine latencies, and their setting.

    Why: a per-token bandwidth cost cannot make a step slower at one request, yet V4-Pro's
    prediction is missing a fixed cost per step. A dispatch or combine has a latency floor
    (kernel launch, RDMA round trip, the receivers' polling) that no bandwidth term carries.
    DeepEP publishes latencies only at 128 tokens per GPU, where part of each is the transfer
    itself, so the floor is what is left after the bytes that cross the NICs are charged at the
    fabric's NIC bandwidth (:func:`latency_floor`). EP 16 is V4-Pro's own layout (2 nodes of 8).

    Correction (2 Dec 2026, after the model was frozen for the pre-registered run): the table is
    for kernels with *pure RDMA*; every copy, even one to a GPU in the same node, goes through
    the NIC, and EP 8 is 8 GPUs on 8 NICs, not an NVLink node (NVLink in the low-latency kernels
    came later, DeepEP PR #173). Its own bandwidth column (dispatch 98 / 63 GB/s, combine
    127 / 74 GB/s at EP 8 / 16) divides the same bytes by the same latencies: the table does not
    separate a floor from the transfer. The 30 + 24 us per layer this model charges is a reading
    (half the bytes at 43 GB/s subtracted), and the EP 8 "intranode" figures below are kept
    only to show what the earlier text argued from.
    """

    tokens_per_gpu: Fact
    hidden: Fact
    top_k: Fact
    nvlink_bw: Fact  # the benchmark's (H800) NVLink, one direction
    ep8_dispatch_us: Fact
    ep8_combine_us: Fact
    ep16_dispatch_us: Fact
    ep16_combine_us: Fact


@dataclass(frozen=True)
class FreeParams:
    """What physical facts leave open: fitted on V4-Flash only, then carried to V4-Pro.

    ``overhead_ms`` is the fixed cost of a step (launch, sync, sampling, framework) and
    ``per_token_us`` the cost of each padded token the roofline misses (expert all-to-all,
    sampling). Transfer rule to another model (a stated assumption, varied in the sensitivity
    study): the fixed overhead scales with the number of layers (per-layer sync points) and the
    per-token cost with layers x hidden (the bytes one token moves through the all-to-all).
    """

    overhead_ms: float
    per_token_us: float
    source: str


@dataclass(frozen=True)
class Deployment:
    """A model served on ``gpus`` accelerators, and the paper's figures for it."""

    model: ModelFacts
    gpu: GpuFacts
    mem_derate: Fact  # share of nominal bandwidth kernels reach
    flops_derate: Fact
    usable_hbm: Fact  # share of HBM for weights + KV (the rest: activations, graphs)
    mtp1_acceptance: Fact  # position-1 acceptance of the MTP head (the baseline)
    sla_tps: tuple[float, float]  # the paper's two SLA points, tok/s/user
    published_gain_pct: tuple[float, float]  # DSpark over MTP-1 at those points
    max_running: Fact
    context_tokens: Fact  # mean context of a running request the step table is made at
    fabric: FabricFacts

    @property
    def gpus(self) -> int:
        """Whole nodes that hold the weights in ``usable_hbm`` of their memory."""
        node = float(self.gpu.hbm_bytes) * float(self.gpu.per_node) * float(self.usable_hbm)
        nodes = max(1, math.ceil(float(self.model.download_bytes) / node))
        return int(nodes * float(self.gpu.per_node))

    @property
    def kv_tokens(self) -> int:
        """KV cache capacity (tokens) left after the weights."""
        free = float(self.gpu.hbm_bytes) * self.gpus * float(self.usable_hbm)
        free -= float(self.model.download_bytes)
        return int(max(free, 0.0) / self.model.kv_bytes_per_token)


V4_FLASH = ModelFacts(
    name="DeepSeek-V4-Flash",
    total_params=Fact(284e9, HF_FLASH),
    active_params=Fact(13e9, HF_FLASH),
    routed_experts=Fact(256, NEMO_FLASH),
    top_k=Fact(6, NEMO_FLASH),
    shared_experts=Fact(1, NEMO_FLASH),
    layers=Fact(43, NEMO_FLASH),
    hidden=Fact(4096, NEMO_FLASH),
    context=Fact(1_048_576, HF_FLASH),
    download_bytes=Fact(160e9, HF_FLASH + " (FP4 experts + FP8 rest, ~160 GB)"),
    kv_ratio_vs_v32=Fact(0.10, V4_REPORT),
)

V4_PRO = ModelFacts(
    name="DeepSeek-V4-Pro",
    total_params=Fact(1.6e12, HF_PRO),
    active_params=Fact(49e9, HF_PRO),
    routed_experts=Fact(384, HF_PRO),
    top_k=Fact(6, HF_PRO),
    shared_experts=Fact(1, HF_PRO),
    layers=Fact(61, HF_PRO),
    hidden=Fact(7168, HF_PRO),
    context=Fact(1_048_576, HF_PRO),
    download_bytes=Fact(865e9, HF_PRO + " (FP4 experts + FP8 rest, ~865 GB)"),
    kv_ratio_vs_v32=Fact(0.10, V4_REPORT),
)

# The paper says only "production GPUs". H20-class is what v4-flash-like assumes (an export-
# market Hopper with more bandwidth than compute); the GPU type is an assumption, not a fit.
H20 = GpuFacts(
    name="H20-class",
    hbm_bytes=Fact(96e9, H20_SPEC),
    mem_bw=Fact(4.0e12, H20_SPEC),
    flops=Fact(296e12, H20_SPEC),
    per_node=Fact(8, "HGX board: 8 GPUs per node"),
)

# A second reading of "production GPUs", for the sensitivity study only: the Hopper DeepSeek's
# own reports measure on (DeepSeek-V3 report; DeepEP's tables), with less memory and bandwidth
# than an H20 and far more compute.
H800 = GpuFacts(
    name="H800",
    hbm_bytes=Fact(80e9, H800_SPEC),
    mem_bw=Fact(3.35e12, H800_SPEC),
    flops=Fact(1979e12, H800_SPEC),
    per_node=Fact(8, "HGX board: 8 GPUs per node"),
)
GPUS = {"H20": H20, "H800": H800}

# One NIC per GPU at 400 Gb/s and NVLink inside an 8-GPU node. The NIC figure is what DeepEP and
# the V3 report give (~50 GB/s); DeepEP's normal kernels reach 43 GB/s across 2 nodes (EP 16), the
# number used here, so the inter-node cost is what a tuned library measures, not a nominal peak.
DEEPEP_LL_BENCH = LowLatencyBench(
    tokens_per_gpu=Fact(128, DEEPEP_LL),
    hidden=Fact(7168, DEEPEP_LL),
    top_k=Fact(8, DEEPEP_LL),
    nvlink_bw=Fact(160e9, DEEPEP + " (H800 NVLink ~160 GB/s)"),
    ep8_dispatch_us=Fact(77, DEEPEP_LL + ": dispatch, EP 8, 77 us"),
    ep8_combine_us=Fact(114, DEEPEP_LL + ": combine, EP 8, 114 us"),
    ep16_dispatch_us=Fact(118, DEEPEP_LL + ": dispatch, EP 16, 118 us"),
    ep16_combine_us=Fact(195, DEEPEP_LL + ": combine, EP 16, 195 us"),
)

HGX_FABRIC = FabricFacts(
    nvlink_bw=Fact(450e9, H20_NVLINK),
    nic_bw=Fact(43e9, DEEPEP + "; internode EP 16 bottleneck bandwidth 43 GB/s (nominal ~50)"),
    dispatch_bytes=Fact(1, V3_COMM + "; " + DEEPEP),
    dispatch_scale_bytes=Fact(4, V3_COMM),
    scale_block=Fact(128, V3_COMM),
    combine_bytes=Fact(2, V3_COMM + "; " + DEEPEP),
    ll_bench=DEEPEP_LL_BENCH,
)

MTP1_ACCEPTANCE = Fact(0.875, V3_REPORT + "; midpoint, 0.85 and 0.90 in the sensitivity study")


def _deployment(model: ModelFacts, sla: tuple[float, float], gain: tuple[float, float]):
    return Deployment(
        model=model,
        gpu=H20,
        mem_derate=Fact(0.75, PROFILE_ASSUMPTION),
        flops_derate=Fact(0.45, PROFILE_ASSUMPTION),
        usable_hbm=Fact(0.90, "vLLM gpu_memory_utilization default 0.9"),
        mtp1_acceptance=MTP1_ACCEPTANCE,
        sla_tps=sla,
        published_gain_pct=gain,
        max_running=Fact(512, PROFILE_ASSUMPTION + " (max concurrent requests)"),
        context_tokens=Fact(2048, PROFILE_ASSUMPTION + " (prompt ~512 + output ~220 x reuse)"),
        fabric=HGX_FABRIC,
    )


FLASH_DEPLOYMENT = _deployment(V4_FLASH, (80.0, 120.0), (51.0, 661.0))
PRO_DEPLOYMENT = _deployment(V4_PRO, (35.0, 50.0), (52.0, 406.0))
DEPLOYMENTS = {"v4-flash": FLASH_DEPLOYMENT, "v4-pro": PRO_DEPLOYMENT}

# The fit that ships (made by the retired ``specsim report paper-check``).
FLASH_FIT = FreeParams(
    overhead_ms=12.9,
    per_token_us=60.0,
    source="fitted on V4-Flash (+51% at 80, +661% at 120 tok/s/user) by specsim report paper-check",
)


TRANSFER_RULES = ("layers", "layers-hidden", "constant")


def transfer(
    fit: FreeParams, to: ModelFacts, base: ModelFacts = V4_FLASH, rule: str = "layers"
) -> FreeParams:
    """The free parameters carried from ``base`` to ``to`` by a stated transfer rule.

    The per-token cost always scales with layers x hidden (the bytes one token moves). The
    fixed cost is the open question, so the rule names it: ``layers`` (the primary rule: one
    sync point per layer), ``layers-hidden`` (the per-token rule applied to the fixed cost too:
    fixed work that grows with the layer's width) or ``constant`` (both costs equal to
    ``base``'s: nothing carried).
    """
    if rule not in TRANSFER_RULES:
        raise ValueError(f"unknown transfer rule {rule!r}; use one of {TRANSFER_RULES}")
    layers = float(to.layers) / float(base.layers)
    width = float(to.hidden) / float(base.hidden)
    if rule == "constant":
        return replace(fit, source=f"{fit.source}; {to.name} given {base.name}'s overheads")
    fixed = layers * (width if rule == "layers-hidden" else 1.0)
    return FreeParams(
        overhead_ms=fit.overhead_ms * fixed,
        per_token_us=fit.per_token_us * layers * width,
        source=f"{fit.source}; carried to {to.name} by {rule.replace('-', ' x ')} (fixed) and "
        "layers x hidden (per token)",
    )


@dataclass(frozen=True)
class AllToAll:
    """The expert all-to-all's cost per padded token of a step, derived from the fabric.

    Why a derived term: V4-Pro needs 2 nodes, so part of every token's dispatch and combine
    crosses the NICs (~10x less bandwidth than NVLink), which a per-token overhead fitted on
    single-node V4-Flash and scaled by layers x hidden does not carry. Model: tokens spread
    evenly over the GPUs (data-parallel attention) and experts spread evenly too, so of a token's
    ``top_k`` expert copies a share ``(gpus - per_node) / gpus`` goes to another node and
    ``(per_node - 1) / gpus`` to another GPU of its node (no per-node deduplication: DeepEP's
    decode kernels send one copy per expert); every GPU sends its tokens' bytes at once, so the
    step pays bytes / (gpus x link bandwidth) per token. The latency floor of the cross-node
    dispatch and combine (:func:`latency_floor`) is a fixed cost per step: ``floor_ms``, charged
    only when the deployment spans nodes.
    """

    bytes_per_copy: float  # dispatch + combine bytes of one token to one expert, one layer
    nvlink_share: float  # share of the top-k copies that go to another GPU of the node
    nic_share: float  # share that goes to another node
    nvlink_us: float  # per padded token, whole deployment, all MoE layers
    nic_us: float
    floor_us_per_layer: float  # cross-node dispatch + combine floor of one MoE layer (0: 1 node)
    layers: int  # MoE layers that pay it (every layer counted, as for the bytes)

    @property
    def total_us(self) -> float:
        return self.nvlink_us + self.nic_us

    @property
    def floor_ms(self) -> float:
        """Fixed cost per step: the cross-node floor of every MoE layer's dispatch + combine."""
        return self.floor_us_per_layer * self.layers / 1000.0


@dataclass(frozen=True)
class LatencyFloor:
    """Dispatch and combine floors (us) left after the published latency's transfer time."""

    dispatch_us: float  # EP 16 (2 nodes of 8): latency - cross-node bytes / NIC bandwidth
    combine_us: float
    intranode_dispatch_us: float  # EP 8 (1 node): latency - other-GPU bytes / NVLink bandwidth
    intranode_combine_us: float

    @property
    def per_layer_us(self) -> float:
        """One MoE layer pays one dispatch and one combine."""
        return self.dispatch_us + self.combine_us


def latency_floor(fabric: FabricFacts, per_node: float = 8.0) -> LatencyFloor:
    """The floor of DeepEP's low-latency dispatch / combine, from its published EP 8/16 table.

    At EP 16 half of a GPU's copies go to the other node; their bytes (128 tokens x top-8 x the
    dispatch or combine width) at ``fabric.nic_bw`` are the transfer part of the latency, the
    rest is the floor (the NVLink half runs beside it and takes less time). At EP 8 the copies to
    the 7 other GPUs cross the benchmark's NVLink instead.
    """
    b = fabric.ll_bench
    h = float(b.hidden)
    copies = float(b.tokens_per_gpu) * float(b.top_k)
    scales = h / float(fabric.scale_block) * float(fabric.dispatch_scale_bytes)
    d_bytes = copies * (h * float(fabric.dispatch_bytes) + scales)
    c_bytes = copies * h * float(fabric.combine_bytes)
    cross = (16.0 - per_node) / 16.0
    other = (per_node - 1.0) / per_node
    nic, nvl = float(fabric.nic_bw), float(b.nvlink_bw)
    return LatencyFloor(
        dispatch_us=float(b.ep16_dispatch_us) - 1e6 * d_bytes * cross / nic,
        combine_us=float(b.ep16_combine_us) - 1e6 * c_bytes * cross / nic,
        intranode_dispatch_us=float(b.ep8_dispatch_us) - 1e6 * d_bytes * other / nvl,
        intranode_combine_us=float(b.ep8_combine_us) - 1e6 * c_bytes * other / nvl,
    )


def all_to_all(dep: Deployment) -> AllToAll:
    """The derived expert all-to-all cost of ``dep`` (every layer counted as an MoE layer).

    The latency floor is charged only when ``dep`` spans nodes: a single node's floor (DeepEP's
    EP 8 row) is inside the fixed overhead fitted on single-node V4-Flash and carried to Pro by
    the layers rule, so charging it again would count it twice.
    """
    m, f = dep.model, dep.fabric
    hidden = float(m.hidden)
    copy = hidden * float(f.dispatch_bytes) + hidden * float(f.combine_bytes)
    copy += hidden / float(f.scale_block) * float(f.dispatch_scale_bytes)
    gpus, node = float(dep.gpus), float(dep.gpu.per_node)
    nvl_share = (min(node, gpus) - 1.0) / gpus
    nic_share = max(gpus - node, 0.0) / gpus
    per_layer = float(m.top_k) * copy * float(m.layers)  # bytes one token moves, all layers
    return AllToAll(
        bytes_per_copy=copy,
        nvlink_share=nvl_share,
        nic_share=nic_share,
        nvlink_us=1e6 * per_layer * nvl_share / (gpus * float(f.nvlink_bw)),
        nic_us=1e6 * per_layer * nic_share / (gpus * float(f.nic_bw)),
        floor_us_per_layer=latency_floor(f, node).per_layer_us if gpus > node else 0.0,
        layers=int(float(m.layers)),
    )


def sources(dep: Deployment) -> dict[str, str]:
    """``key: value (source)`` lines for a profile header: every parameter with its source."""
    m = dep.model
    out: dict[str, str] = {}
    for key in ("total_params", "active_params", "routed_experts", "top_k", "shared_experts",
                "layers", "hidden", "context", "download_bytes", "kv_ratio_vs_v32"):  # fmt: skip
        f: Fact = getattr(m, key)
        out[key] = f"{f.value:g} ({f.source})"
    out["bytes_per_param"] = f"{m.bytes_per_param:.3f} (derived: download_bytes / total_params)"
    out["expert_share"] = f"{m.expert_share:.4f} (derived: active = (1-s)P + sPk/E)"
    out["kv_bytes_per_token"] = (
        f"{m.kv_bytes_per_token:.0f} (derived: V3.2 MLA 1152 B/layer x layers x kv ratio)"
    )
    g = dep.gpu
    out["gpu"] = f"{g.name} {g.hbm_bytes.value:g} B, {g.mem_bw.value:g} B/s, " + (
        f"{g.flops.value:g} FLOP/s ({g.hbm_bytes.source}; the paper says only 'production GPUs')"
    )
    out["gpus_derived"] = f"{dep.gpus} (derived: whole 8-GPU nodes holding the weights)"
    for key in ("mem_derate", "flops_derate", "usable_hbm", "mtp1_acceptance", "max_running",
                "context_tokens"):  # fmt: skip
        f = getattr(dep, key)
        out[key] = f"{f.value:g} ({f.source})"
    a, fl = all_to_all(dep), latency_floor(dep.fabric, float(g.per_node))
    out["a2a_per_token_us"] = (
        f"{a.total_us:.3f} (derived: top-k x (dispatch FP8 + scales + combine BF16) x layers x "
        f"share / (GPUs x bandwidth); NVLink {dep.fabric.nvlink_bw.value:g} B/s "
        f"({dep.fabric.nvlink_bw.source}), NIC {dep.fabric.nic_bw.value:g} B/s "
        f"({dep.fabric.nic_bw.source}))"
    )
    out["a2a_floor_ms"] = (
        f"{a.floor_ms:.3f} (derived: {a.floor_us_per_layer:.1f} us per MoE layer x "
        f"{a.layers} layers, charged only across nodes ({dep.gpus} GPUs, "
        f"{g.per_node.value:g} per node); dispatch {fl.dispatch_us:.1f} + combine "
        f"{fl.combine_us:.1f} us = DeepEP EP 16 latency "
        f"{dep.fabric.ll_bench.ep16_dispatch_us.value:g} / "
        f"{dep.fabric.ll_bench.ep16_combine_us.value:g} us minus its cross-node bytes at the NIC "
        f"bandwidth ({DEEPEP_LL}))"
    )
    out["published"] = (
        f"+{dep.published_gain_pct[0]:g}% at {dep.sla_tps[0]:g}, +{dep.published_gain_pct[1]:g}% "
        f"at {dep.sla_tps[1]:g} tok/s/user ({DSPARK})"
    )
    return out


__all__ = [
    "DEEPEP_LL_BENCH",
    "DEPLOYMENTS",
    "HGX_FABRIC",
    "FLASH_DEPLOYMENT",
    "FLASH_FIT",
    "MTP1_ACCEPTANCE",
    "PRO_DEPLOYMENT",
    "V4_FLASH",
    "V4_PRO",
    "AllToAll",
    "Deployment",
    "FabricFacts",
    "Fact",
    "FreeParams",
    "GpuFacts",
    "LatencyFloor",
    "LowLatencyBench",
    "ModelFacts",
    "all_to_all",
    "latency_floor",
    "sources",
    "transfer",
]
