"""Kernel paths and collectives by GPU family: what the same operator costs on another GPU's
kernels and interconnect than the measured H100 curves assume (cost model v5, issue 63, items
2-3). Each fact names its public source; where the sources disagree the range carries them.

Kept apart from :mod:`~specsim.sim.cost.build` (which prices a step's terms) because these are
per-GPU facts a term consults: the all-reduce latency factor and the W4A16 path of FP4 weights
on a GPU without FP4 tensor units.
"""

from __future__ import annotations

from typing import Any

from specsim.sim.cost.assumed import Assumed
from specsim.sim.cost.operators import WEIGHT_DTYPES

# Small-message all-reduce latency on a GPU's own interconnect, over the measured H100 curve's
# (Vidur's, NVLink 4). Every Hopper part shares NVLink 4 (NVIDIA/nccl #1940: ~2.3 us on both
# 8x H800 and 8x H200 at one tuning). Public small-message figures, each under its own tuning
# (engine facts §5): NVIDIA/nccl #1940, 8x B200 ~3 us against ~2.3 us on Hopper (x1.3);
# NVIDIA/nccl-tests #333, 9 us (2) and 22 us (4) B200s measured by a user (up to x3 against
# H100's ~6 us at 2 GPUs, NVIDIA/nccl #1259); AMD: no RCCL table found, ~5 us with fused
# kernels on 8x MI300X (Epliz/muiLLM PR #6). The mids stay at the measured curve: vLLM's fig. 2
# (B300, the one calibration source on Blackwell) fits there, and the public figures come from
# differently tuned tests; the ranges carry what they say.
AR_LATENCY = {
    "blackwell": Assumed(0.8, 1.0, 3.0, "Blackwell small-message all-reduce latency x the "
                         "H100's (vLLM's fig. 2, B300 TP4, fits at x1.0; NVIDIA/nccl #1940 "
                         "x1.3 at one tuning; nccl-tests #333 up to x3)", spec=+1),
    "amd": Assumed(0.8, 1.0, 2.0, "AMD small-message all-reduce latency x the H100's (ASSUMED: "
                   "no published RCCL table; ~5 us fused on 8x MI300X, Epliz/muiLLM PR #6)",
                   spec=+1),
}  # fmt: skip
BLACKWELL = frozenset({"B200", "B300", "GB200", "GB300"})
AMD = frozenset({"MI300X", "MI355X"})


def ar_latency(gpu: str) -> Assumed | None:
    """The assumed all-reduce latency factor of ``gpu`` (None: Hopper/A100, as measured)."""
    return (
        AR_LATENCY["blackwell"] if gpu in BLACKWELL else AR_LATENCY["amd"] if gpu in AMD else None
    )


def w4a16(p: Any, dtype_bytes: float) -> bool:
    """Whether weights of ``dtype_bytes`` a parameter (0.5: FP4) run as W4A16 on this GPU: no FP4
    tensor units, so dequantised to BF16 (``operators.W4A16_NOTE``)."""
    from specsim.sim.cost.accelerators import accelerator

    if dtype_bytes != WEIGHT_DTYPES["fp4"]:
        return False
    return p.dep.gpu == "A100" or not float(accelerator(p.dep.gpu).fp4_flops)


def expert_flops(p: Any) -> float:
    """FLOP/s the routed experts' GEMMs are priced at: the curves' rate for the weights'
    precision, or BF16's where FP4 experts run W4A16 (a model whose experts alone are FP4)."""
    o = p.ops
    if not w4a16(p, p.ebpp) or p.bpp == p.ebpp:  # same precision: the curves' own rate
        return float(o.flops)
    from specsim.sim.cost.accelerators import accelerator
    from specsim.sim.cost.operators import REFERENCE

    return REFERENCE["a100"][1] if p.dep.gpu == "A100" else accelerator(p.dep.gpu).flops("bf16")


__all__ = ["AMD", "AR_LATENCY", "BLACKWELL", "ar_latency", "expert_flops", "w4a16"]
