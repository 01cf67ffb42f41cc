"""Sourced deployment models of DeepSeek V4-Flash and V4-Pro (``specsim report real-deployments``;
first built for the retired paper check, reports/paper-check).

Why a module of facts: the DSpark paper's production table (V4-Flash +51% / +661% and V4-Pro
+52% / +406% throughput over MTP-1 at two per-user SLAs each) is the one published measurement
of prefix scheduling at scale. To test the simulator against it, the two cost profiles must come
from public facts, each with its source, so that a prediction for V4-Pro made from a fit on
V4-Flash is a prediction and not a second fit. Every number here is a :class:`Fact` (value +
citation); ``profile build`` prices both models from them (``specsim.sim.cost.models``).

This module is pure data and arithmetic: it imports nothing from the simulator, so
``specsim.sim.cost.models`` and the all-to-all terms can read it without an import cycle. The
roofline profile once built from these facts (``v4-pro-like``, with a fit of its free overheads on
V4-Flash) was retired after commit ea0e208; ``profile build`` prices V4 from the same facts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
class Deployment:
    """A model served on ``gpus`` accelerators, and the paper's figures for it."""

    model: ModelFacts
    gpu: GpuFacts
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

__all__ = [
    "DEEPEP_LL_BENCH",
    "DEPLOYMENTS",
    "HGX_FABRIC",
    "FLASH_DEPLOYMENT",
    "MTP1_ACCEPTANCE",
    "PRO_DEPLOYMENT",
    "V4_FLASH",
    "V4_PRO",
    "Deployment",
    "FabricFacts",
    "Fact",
    "GpuFacts",
    "LowLatencyBench",
    "ModelFacts",
]
