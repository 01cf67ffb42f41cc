"""Measured operator curves: what a GEMM, an elementwise op and an all-reduce take on a GPU.

Why: a roofline with hand-set derates gets speculation's gain wrong both ways (a 256-token
verify nearly free on one H100, an MoE deployment's small batches too dear). These curves come
from Vidur's measured operator times (microsoft/vidur @ 7d47513, MIT, Copyright (c) Microsoft
Corporation; ``specsim/data/operators/README.md``), reduced by
``scripts/derive_operator_tables.py``:

- a linear op reading W weight bytes for T tokens takes
  ``launch(T) + W * max(1 / BW, (2 / bytes_per_param) T / FLOPS) / roofline_frac(T)``
  (at a fixed T the memory and compute times are both proportional to W, so one line per T);
- an elementwise op over N elements: ``launch + N * bytes_per_elem / BW``;
- an all-reduce of S bytes over n GPUs of one node: ``latency + 2 (n - 1) / n S / bus_bw``.

Carrying to another GPU (the stated rule): the H100 curves are the reference (A100's own where
asked for A100). Bandwidth and FLOP/s are the target's published ones (``accelerators``);
``roofline_frac`` is read at the same position relative to the ridge point (T scaled by the
reference's ridge over the target's, the ridge being where a GEMM turns compute-bound:
T_ridge = FLOPS * bytes_per_param / (2 BW)); launch and all-reduce latency are kept; the
all-reduce bus bandwidth scales with the scale-up link (NVLink / Infinity Fabric) per GPU.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources

import numpy as np

from specsim.errors import SpecsimError
from specsim.sim.cost.accelerators import ACCELERATORS, accelerator
from specsim.sim.cost.accelerators import gpu_name as _accelerator_name

# The two GPUs Vidur profiled: published HBM bytes/s, dense BF16 FLOP/s, scale-up link bytes/s
# per direction (the derive script uses the same figures).
REFERENCE = {"h100": (3.35e12, 989e12, 450e9), "a100": (2.039e12, 312e12, 300e9)}
WEIGHT_DTYPES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "fp4": 0.5}
# The kernel path of FP4 weights on a GPU without FP4 tensor units (Hopper, MI300X): the
# weights are read at 4 bits and dequantised to BF16 in registers, and the GEMM runs on the BF16
# tensor cores (W4A16: Marlin, or CUTLASS W4A16), the FP8 units idle (vllm issue #42284 comment,
# 2026-09-20; lightseekorg/tokenspeed PR #1664; vllm mxfp4.py's SM90 backends). Priced at the
# BF16 rate, not FP8's (what v4 assumed).
W4A16_NOTE = (
    "fp4 weights without FP4 tensor units run dequantised to BF16 (W4A16: Marlin / CUTLASS), at "
    "the BF16 rate (vllm #42284; lightseekorg/tokenspeed PR #1664)"
)


def _table(name: str):  # type: ignore[no-untyped-def]
    import pandas as pd

    path = resources.files("specsim") / "data" / "operators" / name
    with path.open("r", encoding="utf-8") as fh:
        return pd.read_csv(fh)


@functools.cache
def _tables():  # type: ignore[no-untyped-def]
    return _table("linear.csv"), _table("elementwise.csv"), _table("all_reduce.csv")


@dataclass(frozen=True, eq=False)
class OperatorCurves:
    """The measured curves carried to one GPU at one weight precision (all times in seconds)."""

    gpu: str
    mem_bw: float  # published bytes/s
    flops: float  # published dense FLOP/s at the weights' compute precision
    bytes_per_param: float
    link_bw: float  # scale-up link bytes/s per direction
    reference: str  # the Vidur GPU the curves come from
    tokens: np.ndarray  # reference token grid
    launch_s: np.ndarray
    frac: np.ndarray
    ridge_scale: float  # reference ridge / target ridge: T on the target -> T on the reference
    elementwise: dict[str, tuple[float, float]]  # op -> (launch s, s per element)
    all_reduce: dict[int, tuple[float, float]]  # workers -> (latency s, s per bus byte)
    # the small-message latency of this GPU's interconnect over the measured H100's (a
    # deployment's assumed term: ``build.AR_LATENCY``); 1.0 as measured
    ar_latency_scale: float = 1.0

    def _at(self, tokens) -> tuple[np.ndarray, np.ndarray]:  # type: ignore[no-untyped-def]
        t_ref = np.asarray(tokens, dtype=np.float64) * self.ridge_scale
        launch = np.interp(t_ref, self.tokens, self.launch_s)
        return launch, np.interp(t_ref, self.tokens, self.frac)

    def gemm_s(self, tokens, weight_bytes):  # type: ignore[no-untyped-def]
        """A linear op over ``tokens`` rows reading ``weight_bytes`` of weights (arrays
        broadcast); 0 where there are no tokens or no weights."""
        t = np.asarray(tokens, dtype=np.float64)
        w = np.asarray(weight_bytes, dtype=np.float64)
        launch, frac = self._at(np.maximum(t, 1.0))
        per_byte = np.maximum(1.0 / self.mem_bw, (2.0 / self.bytes_per_param) * t / self.flops)
        return np.where((t > 0) & (w > 0), launch + w * per_byte / frac, 0.0)

    @property
    def mem_frac(self) -> float:
        """The share of published bandwidth a memory-bound read reaches (the curve at T = 1):
        what a decode attention's KV read is priced at."""
        return float(self._at(1.0)[1])

    @property
    def compute_frac(self) -> float:
        """The share of published FLOP/s a large compute-bound op reaches (the curve's end)."""
        return float(self.frac[-1])

    def read_s(self, nbytes):  # type: ignore[no-untyped-def]
        """Streaming ``nbytes`` from HBM at the measured memory-bound fraction (no launch)."""
        return np.asarray(nbytes, dtype=np.float64) / (self.mem_bw * self.mem_frac)

    def flops_s(self, flop):  # type: ignore[no-untyped-def]
        """``flop`` of BF16 tensor work at the measured compute-bound fraction (no launch)."""
        bf16 = self.flops * self.bytes_per_param / 2.0  # the weights' precision -> BF16
        return np.asarray(flop, dtype=np.float64) / (bf16 * self.compute_frac)

    def elementwise_s(self, op: str, elements):  # type: ignore[no-untyped-def]
        """An elementwise op (``input_layernorm``, ``attn_rope``, ``mlp_act``, ``add``, ``emb``
        ...) over ``elements`` values; 0 for none."""
        launch, per = self.elementwise[op]
        n = np.asarray(elements, dtype=np.float64)
        return np.where(n > 0, launch + n * per, 0.0)

    def all_reduce_s(self, nbytes, workers: int):  # type: ignore[no-untyped-def]
        """An all-reduce of ``nbytes`` over ``workers`` GPUs of one node (0 for one GPU); past
        the largest measured group (8) the 8-GPU fit is used."""
        if workers <= 1:
            return np.zeros_like(np.asarray(nbytes, dtype=np.float64))
        known = sorted(self.all_reduce)
        key = min((k for k in known if k >= workers), default=known[-1])
        lat, per = self.all_reduce[key]
        bus = 2.0 * (workers - 1) / workers * np.asarray(nbytes, dtype=np.float64)
        return lat * self.ar_latency_scale + bus * per


def gpu_name(gpu: str) -> str:
    """A GPU the curves can be carried to: the accelerators' table, or Vidur's own A100
    (:func:`specsim.sim.cost.accelerators.gpu_name`'s spellings and refusals)."""
    return _accelerator_name(gpu, (*ACCELERATORS, "A100"))


def curves(gpu: str, weight_dtype: str = "bf16", reference: str | None = None) -> OperatorCurves:
    """The curves for ``gpu`` (an ``accelerators`` name, or ``A100`` for Vidur's own) with
    weights in ``weight_dtype`` (bf16, fp16, fp8, fp4), carried by the module's rule from
    ``reference`` (``h100`` or ``a100``; default: the GPU's own where Vidur measured it, else
    ``h100``)."""
    if weight_dtype not in WEIGHT_DTYPES:
        raise SpecsimError(
            f"unknown weight dtype {weight_dtype!r}; use one of {', '.join(WEIGHT_DTYPES)}"
        )
    bpp = WEIGHT_DTYPES[weight_dtype]
    precision = {"bf16": "bf16", "fp16": "bf16", "fp8": "fp8", "fp4": "fp4"}[weight_dtype]
    key = gpu_name(gpu).lower()
    if key == "a100":
        bw, flops, link = REFERENCE["a100"]  # no FP8/FP4 units: computes in BF16
        name = "A100-SXM"
    else:
        acc = accelerator(gpu)
        name, bw, flops = acc.name, float(acc.mem_bw), acc.flops(precision)
        if precision == "fp4" and not float(acc.fp4_flops):
            flops = acc.flops("bf16")  # W4A16: see W4A16_NOTE
        link = float(acc.nvlink_bw)
    ref = reference or (key if key in REFERENCE else "h100")
    r_bw, r_flops, r_link = REFERENCE[ref]
    lin, elem, ar = _tables()
    lin = lin[lin.gpu == ref].sort_values("tokens")
    ridge_ref = r_flops / r_bw  # BF16 (2 bytes a parameter): T_ridge = FLOPS * 2 / (2 BW)
    ridge = flops * bpp / (2.0 * bw)
    ew = elem[elem.gpu == ref]
    ars = ar[(ar.gpu == ref) & (ar.topology == "dgx")]
    return OperatorCurves(
        gpu=name,
        mem_bw=bw,
        flops=flops,
        bytes_per_param=bpp,
        link_bw=link,
        reference=ref,
        tokens=lin.tokens.to_numpy(np.float64),
        launch_s=lin.launch_us.to_numpy(np.float64) * 1e-6,
        frac=lin.roofline_frac.to_numpy(np.float64),
        ridge_scale=ridge_ref / ridge,
        elementwise={
            r.op: (r.launch_us * 1e-6, r.bytes_per_elem / bw) for r in ew.itertuples()
        },  # bytes_per_elem is at the reference's peak: carried by bandwidth
        all_reduce={
            int(r.workers): (r.latency_us * 1e-6, 1.0 / (r.bus_gbps * 1e9 * link / r_link))
            for r in ars.itertuples()
        },
    )


def layer_s(o, t, width, attn_params, inter, bpp, tp):  # type: ignore[no-untyped-def]
    """One dense transformer layer's linear and elementwise ops (seconds)."""
    lin = o.gemm_s(t, attn_params * bpp / tp) + o.gemm_s(t, 3 * width * inter * bpp / tp)
    ew = 2 * o.elementwise_s("input_layernorm", t * width) + 2 * o.elementwise_s("add", t * width)
    return lin + ew + o.elementwise_s("mlp_act", t * inter / tp) + o.launch_s[0]


__all__ = [
    "REFERENCE",
    "W4A16_NOTE",
    "WEIGHT_DTYPES",
    "layer_s",
    "OperatorCurves",
    "curves",
    "gpu_name",
]
