"""The terms of ``profile build`` fitted on published measurements, and where each came from.

Why a module of its own: these few numbers are the only ones in the builder fitted rather than
measured per operator or assumed, so they are kept in one place with their source and how they
were fitted. ``scripts/calibrate_profile_build.py`` reproduces them (least squares in log space
over vLLM's fig. 2 tables, V4-Flash-0731 TP4 on B300, CUDA graphs to 1,024 tokens) and
``reports/real-deployments/CALIBRATION.md`` lists every number taken and the held-out checks.
Each entry is (low, fitted, high); the range is what ``--assume low|high`` writes.
"""

from __future__ import annotations

SOURCE = (
    "vLLM blog 'Adaptive Verification in vLLM' (2026-08-14) fig. 2 tables, V4-Flash TP4 B300 "
    "(reports/real-deployments/CALIBRATION.md)"
)

# (low, FITTED, high). Fitted by scripts/calibrate_profile_build.py (least squares on log ms,
# 88 verify + 35 draft sizes of fig. 2); the ranges are ASSUMED (x/÷ 2 around the fit: one
# deployment's fit carried to others), not fitted.
VLLM: dict[str, tuple[float, float, float]] = {
    # fixed cost per step, ms: the fit puts it at its bound 0 (fig. 2's startup profile times
    # the forward; the fixed part sits in the measured launches and all-reduce latencies)
    "step_ms": (0.0, 0.0, 1.0),
    "moe_gemm_eff": (0.061, 0.122, 0.244),  # routed grouped GEMM's share of published FLOP/s
    "draft_launch_ms": (0.42, 0.843, 1.69),  # a draft call's fixed cost, ms
    "draft_position_us": (1.15, 2.30, 4.60),  # per drafted position (requests x block), us
}

# v5: the kernels a DeepSeek-V4 layer launches beyond those the builder counts (compressed
# sparse attention, hyper-connections; specsim.sim.cost.eager), FITTED on fig. 2's eager sizes
# at the assumed 15 us a launch. Replaces v4's eager_ms (74.3 ms on every eager step of any
# model). Refitted by scripts/calibrate_profile_build.py.
V4_EXTRA_KERNELS = 90.1  # fitted 90.08 (kernels a layer; at 15 us: +74.3 ms a V4-Flash TP4 step)

# what the builder wrote before calibration (the prior: no MoE compute term, no eager penalty,
# no drafter overhead): the "fit without source A" row of CALIBRATION.md
PRIOR: dict[str, float] = {
    "step_ms": 1.0, "moe_gemm_eff": 1e12, "v4_extra_kernels": 0.0, "draft_launch_ms": 0.0,
    "draft_position_us": 0.0,
}  # fmt: skip

__all__ = ["PRIOR", "SOURCE", "V4_EXTRA_KERNELS", "VLLM"]
