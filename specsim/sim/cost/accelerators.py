"""Accelerator facts: memory, bandwidth, tensor throughput and links of the GPUs LLMs are served on.

Why a module of facts: a step cost carried from a measured deployment to another GPU (or an
operator curve carried where nothing is measured) is only as good as the numbers it divides by,
and a capacity planner must be able to see where each one comes from. Every figure is a
:class:`~specsim.sim.cost.deployments.Fact` with its source. Conventions:

- tensor throughput is DENSE (NVIDIA quotes sparse figures in most tables: dense = sparse / 2);
- bandwidths are bytes per second; NVLink per GPU and per direction (half the quoted
  bidirectional figure), a NIC per GPU and per direction;
- ``nvl_domain``: GPUs that reach each other over NVLink (8 on an HGX board, 72 in an NVL72 rack).

Sources are NVIDIA's and AMD's product pages and datasheets (named below); where only a
secondary source reproduces a figure, the citation says so. AMD's Infinity Fabric sits in the
``nvlink_bw`` field (the same role: the scale-up link). Pure data: imports nothing from the
simulator.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from specsim.sim.cost.deployments import Fact, GpuFacts

H100_DS = "NVIDIA H100 Tensor Core GPU datasheet (SXM5): 80 GB HBM3, 3.35 TB/s"
H200_DS = "NVIDIA H200 Tensor Core GPU product page / datasheet (SXM): 141 GB HBM3e, 4.8 TB/s"
H20_DS = "NVIDIA H20 specification (secondary: willitrunai.com/gpus/h20-96gb): 96 GB, 4.0 TB/s"
H800_DS = "NVIDIA H800 SXM: H100 SXM memory and compute, NVLink cut to 400 GB/s (DeepEP docs)"
B200_DS = (
    "NVIDIA HGX B200 / DGX B200 specifications (1,000 W; secondary: "
    "glennklockwood.com/garden/processors/B200): 180 GB HBM3e, 8 TB/s"
)
B300_DS = (
    "NVIDIA HGX B300 (Blackwell Ultra) specifications (secondary: "
    "glennklockwood.com/garden/processors/B300, acecloud.ai/blog/nvidia-hgx-b300): 288 GB "
    "HBM3e, 8 TB/s, ConnectX-8 800 Gb/s per GPU"
)
GB200_DS = "NVIDIA GB200 NVL72 product page (per GPU: 186 GB HBM3e, 8 TB/s; 72-GPU NVLink domain)"
GB300_DS = (
    "NVIDIA GB300 NVL72 product page (per GPU: 288 GB HBM3e, 8 TB/s; 72-GPU NVLink domain; "
    "secondary: verda.com/blog/gb300-nvl72-architecture)"
)
MI300X_DS = (
    "AMD Instinct MI300X accelerator datasheet / product page: 192 GB HBM3, 5.3 TB/s, "
    "1,307.4 TFLOP/s FP16/BF16 and 2,614.9 TFLOP/s FP8 dense (no sparsity)"
)
MI355X_DS = (
    "AMD Instinct MI355X product page: 288 GB HBM3E, 8 TB/s, 2.5 PFLOP/s FP16/BF16, 5.0 PFLOP/s "
    "FP8, 10 PFLOP/s MXFP4 dense (secondary: theregister.com 2025-06-12, 288 GB, 8 TB/s, 10 PF "
    "FP4 without sparsity; AMD's ISSCC 2026 paper as reported, 5 PF FP8)"
)
IF_MI300 = (
    "AMD Infinity Fabric on the 8-GPU OAM platform: 7 links x 64 GB/s per direction to the 7 "
    "peers (448 GB/s aggregate per direction; one peer gets 64 GB/s: no switch)"
)
IF_MI355 = (
    "AMD Infinity Fabric (4th gen) on the 8-GPU MI355X platform: 7 links x 153.6 GB/s "
    "bidirectional (AMD's MI355X specifications' peak link bandwidth; secondary: "
    "humeconsulting.co 'AMD MI355X: strong node-level inference', ~153 GB/s bidirectional a "
    "link) = 76.8 GB/s per direction a peer, 537.6 GB/s aggregate per direction; AMD's own "
    "page not read here"
)
NVLINK4 = "NVLink 4 (Hopper): 900 GB/s bidirectional per GPU"
NVLINK5 = "NVLink 5 (Blackwell): 1.8 TB/s bidirectional per GPU"
CX7 = "ConnectX-7 400 Gb/s per GPU (DGX/HGX H100, B200 reference designs)"
CX8 = "ConnectX-8 800 Gb/s per GPU (HGX B300, GB300 NVL72 reference designs)"


@dataclass(frozen=True)
class Accelerator:
    """One GPU's published figures (dense tensor FLOP/s per precision; 0: no such units)."""

    name: str
    hbm_bytes: Fact
    mem_bw: Fact
    bf16_flops: Fact
    fp8_flops: Fact
    fp4_flops: Fact
    nvlink_bw: Fact  # bytes/s per direction
    nic_bw: Fact  # bytes/s per direction, scale-out NIC per GPU
    nvl_domain: Fact  # GPUs in one NVLink domain
    per_node: Fact  # GPUs per server board (HGX 8; an NVL72 tray holds 4)

    def flops(self, precision: str = "fp8") -> float:
        """Dense tensor FLOP/s at ``precision`` (``bf16``, ``fp8`` or ``fp4``; FP4 falls back
        to FP8 on GPUs without FP4 units, as an FP4 checkpoint then computes in FP8)."""
        if precision not in ("bf16", "fp8", "fp4"):
            raise ValueError(f"unknown precision {precision!r}; use bf16, fp8 or fp4")
        v = float(getattr(self, f"{precision}_flops"))
        return v if v > 0 else float(self.fp8_flops)

    def gpu_facts(self, precision: str = "fp8") -> GpuFacts:
        """The subset :mod:`specsim.sim.cost.deployments` builds profiles from."""
        src = getattr(self, f"{precision}_flops").source
        return GpuFacts(
            name=self.name,
            hbm_bytes=self.hbm_bytes,
            mem_bw=self.mem_bw,
            flops=Fact(self.flops(precision), src),
            per_node=self.per_node,
        )


def _hopper(  # noqa: PLR0913 - one line per published figure
    name: str,
    hbm: float,
    bw: float,
    src: str,
    nvlink: float = 450e9,
    nvl_src: str = NVLINK4,
    bf16: float = 989e12,
    fp8: float = 1979e12,
) -> Accelerator:
    return Accelerator(
        name=name,
        hbm_bytes=Fact(hbm, src),
        mem_bw=Fact(bw, src),
        bf16_flops=Fact(bf16, src + "; dense (sparse / 2)"),
        fp8_flops=Fact(fp8, src + "; dense (sparse / 2)"),
        fp4_flops=Fact(0.0, "Hopper has no FP4 tensor units"),
        nvlink_bw=Fact(nvlink, nvl_src + " (per direction)"),
        nic_bw=Fact(50e9, CX7 + " (50 GB/s per direction)"),
        nvl_domain=Fact(8, "HGX board: 8 GPUs on NVSwitch"),
        per_node=Fact(8, "HGX board: 8 GPUs per node"),
    )


def _blackwell(name: str, hbm: float, src: str, bf16: float, fp8: float, fp4: float,
               nic: float, nic_src: str, domain: int, per_node: int) -> Accelerator:  # fmt: skip
    dom_src = "NVL72 rack: 72 GPUs on one NVLink domain" if domain == 72 else "HGX board: 8 GPUs"
    return Accelerator(
        name=name,
        hbm_bytes=Fact(hbm, src),
        mem_bw=Fact(8e12, src),
        bf16_flops=Fact(bf16, src + "; dense"),
        fp8_flops=Fact(fp8, src + "; dense"),
        fp4_flops=Fact(fp4, src + "; dense"),
        nvlink_bw=Fact(900e9, NVLINK5 + " (per direction)"),
        nic_bw=Fact(nic, nic_src),
        nvl_domain=Fact(domain, dom_src),
        per_node=Fact(per_node, "GPUs per board (HGX 8; an NVL72 compute tray 4)"),
    )


def _amd(name: str, hbm: float, bw: float, src: str, bf16: float, fp8: float, fp4: float,
         link: float, link_src: str) -> Accelerator:  # fmt: skip
    return Accelerator(
        name=name,
        hbm_bytes=Fact(hbm, src),
        mem_bw=Fact(bw, src),
        bf16_flops=Fact(bf16, src),
        fp8_flops=Fact(fp8, src),
        fp4_flops=Fact(fp4, src if fp4 else "MI300X has no FP4 units"),
        nvlink_bw=Fact(link, link_src),  # Infinity Fabric, the same role as NVLink
        nic_bw=Fact(50e9, "400 Gb/s NIC per GPU (AMD reference platform; 50 GB/s per direction)"),
        nvl_domain=Fact(8, "8-GPU OAM platform: all-to-all Infinity Fabric"),
        per_node=Fact(8, "8 GPUs per node"),
    )


ACCELERATORS: dict[str, Accelerator] = {
    "H100": _hopper("H100-SXM", 80e9, 3.35e12, H100_DS),
    "H200": _hopper("H200-SXM", 141e9, 4.8e12, H200_DS),
    "H20": _hopper("H20", 96e9, 4.0e12, H20_DS, bf16=148e12, fp8=296e12),
    "H800": _hopper(
        "H800-SXM",
        80e9,
        3.35e12,
        H800_DS,
        nvlink=200e9,
        nvl_src="H800 NVLink: 400 GB/s bidirectional",
    ),  # fmt: skip
    "B200": _blackwell(
        "B200", 180e9, B200_DS, 2.25e15, 4.5e15, 9e15, 50e9, CX7 + " (50 GB/s per direction)", 8, 8
    ),  # fmt: skip
    "B300": _blackwell(
        "B300",
        288e9,
        B300_DS,
        2.25e15,
        4.5e15,
        13.5e15,
        100e9,
        CX8 + " (100 GB/s per direction)",
        8,
        8,
    ),  # fmt: skip
    "GB200": _blackwell(
        "GB200",
        186e9,
        GB200_DS,
        2.5e15,
        5e15,
        10e15,
        50e9,
        CX7 + " (typical GB200 NVL72 scale-out; to confirm per site)",
        72,
        4,
    ),  # fmt: skip
    "GB300": _blackwell(
        "GB300",
        288e9,
        GB300_DS,
        2.5e15,
        5e15,
        15e15,
        100e9,
        CX8 + " (100 GB/s per direction)",
        72,
        4,
    ),  # fmt: skip
    "MI300X": _amd("MI300X", 192e9, 5.3e12, MI300X_DS, 1307.4e12, 2614.9e12, 0.0, 448e9, IF_MI300),
    "MI355X": _amd("MI355X", 288e9, 8e12, MI355X_DS, 2.5e15, 5e15, 10e15, 537.6e9, IF_MI355),
}


# Other spellings of the GPUs above, separators and case ignored (:func:`gpu_key`): every
# figure above is the SXM (or OAM) part's, so naming the form changes nothing. An "80GB"
# without the form is no alias: the H100 and A100 PCIe cards have 80 GB too.
GPU_ALIASES = {
    "H100SXM": "H100", "H100SXM5": "H100", "H100SXM580GB": "H100", "H100SXM80GB": "H100",
    "H200SXM": "H200", "H200SXM141GB": "H200", "H800SXM": "H800", "A100SXM": "A100",
    "A100SXM4": "A100", "A100SXM480GB": "A100", "A100SXM80GB": "A100",
}  # fmt: skip
A100_40GB = "the 40 GB A100 (1.6 TB/s) has half the memory of the 80 GB A100 SXM Vidur measured"
# GPUs users name that specsim has no figures for, and why the nearest named one is not them
NOT_MODELLED = {
    "H100PCIE": "the H100 PCIe (80 GB HBM2e at 2.0 TB/s, 114 SMs, NVLink only over a 2-GPU "
    "bridge) is slower than the H100 SXM whose figures specsim has",
    "H100NVL": "the H100 NVL (94 GB at 3.9 TB/s, NVLink over a 2-GPU bridge) is neither the "
    "H100 SXM nor the H200",
    "A100PCIE": "the A100 PCIe (1.9 TB/s or less) is slower than the A100 SXM Vidur measured",
    "A10040GB": A100_40GB,
    "A100SXM40GB": A100_40GB,
    "A100SXM440GB": A100_40GB,
}


def gpu_key(name: str) -> str:
    """``name`` compared as the tables key it: upper case, a leading NVIDIA / AMD and every
    space, dash, underscore and dot dropped (``nvidia h100-sxm5`` -> ``H100SXM5``)."""
    key = re.sub(r"[\s\-_.]+", "", str(name).upper())
    return re.sub(r"^(NVIDIA|AMD)", "", key)


def gpu_name(name: str, known: tuple[str, ...] | None = None) -> str:
    """The table name of GPU ``name`` (one of ``known``, by default :data:`ACCELERATORS`;
    case and separators ignored, SXM spellings accepted), or a one-line refusal saying why
    and listing the nearest names: a GPU without figures is refused, never priced as another."""
    known = tuple(known or ACCELERATORS)
    by_key = {gpu_key(k): k for k in known}
    key = gpu_key(name)
    key = gpu_key(GPU_ALIASES.get(key, key))
    if key in by_key:
        return by_key[key]
    from specsim.errors import SpecsimError

    why = f": {NOT_MODELLED[key]}" if key in NOT_MODELLED else ""
    near = [by_key[k] for k in difflib.get_close_matches(key, list(by_key), n=3, cutoff=0.5)]
    hint = f"; the nearest: {', '.join(near)}" if near else ""
    raise SpecsimError(
        f"unknown GPU {name!r}{why}{hint}; use one of {', '.join(known)}, or import a profile "
        "measured on it (specsim profile import)"
    )


def accelerator(name: str) -> Accelerator:
    """A GPU by name (case-insensitive; ``H100``, ``H200``, ``H20``, ``H800``, ``B200``,
    ``B300``, ``GB200``, ``GB300``, ``MI300X``, ``MI355X``; SXM spellings: :func:`gpu_name`)."""
    return ACCELERATORS[gpu_name(name)]


__all__ = ["ACCELERATORS", "Accelerator", "accelerator", "gpu_key", "gpu_name"]
