"""The expert all-to-all a deployment's MoE layers pay, derived from its fabric.

Why apart from :mod:`specsim.sim.cost.deployments` (the facts): these are derivations from
those facts (bandwidth shares, DeepEP's published latency less its transfer), and a reader of
the facts should not have to read the arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

from specsim.sim.cost.deployments import Deployment, FabricFacts


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


__all__ = ["AllToAll", "LatencyFloor", "all_to_all", "latency_floor"]
