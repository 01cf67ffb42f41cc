"""Confidence thresholds: ``threshold:T`` on the conditional c_k, ``cum-threshold:T`` on the
survival a_k = prod_{i<=k} c_i.

Both cut at the FIRST position that fails, so admitting draft k looks only at c_1..c_k: they are
non-anticipating. (Thresholding on the draft's own probability q(x_k) instead would be lossy: a
mutant in the losslessness suite.)
"""

from __future__ import annotations

import numpy as np

from specsim.errors import SpecsimError
from specsim.policies.base import POLICIES, Policy, StepInput


def _parse(name: str, arg: str | None, default: float) -> float:
    if arg is None:
        return default
    try:
        t = float(arg)
    except ValueError:
        raise SpecsimError(f"{name}:{arg}: T must be a number in [0, 1]") from None
    if not 0.0 <= t <= 1.0:
        raise SpecsimError(f"{name}:{arg}: T must be a number in [0, 1]")
    return t


def leading_true(mask: np.ndarray) -> np.ndarray:
    """Number of leading True values per row of a (R, gamma) boolean array."""
    return np.cumprod(mask, axis=1).sum(axis=1).astype(np.int64)


@POLICIES.register("threshold", help="threshold:T: cut at the first conditional c_k < T")
def threshold(arg: str | None = None) -> Policy:
    t = _parse("threshold", arg, 0.5)

    def schedule(inp: StepInput) -> np.ndarray:
        return leading_true(inp.conf >= t)

    def solo(conf: np.ndarray, accept_len: np.ndarray, step_time) -> np.ndarray:
        return leading_true(conf >= t)  # row-wise already

    return Policy(
        name=f"threshold:{t:g}", schedule=schedule, solo=solo, rowwise=True, solo_rows=True
    )


@POLICIES.register(
    "cum-threshold", help="cum-threshold:T: cut where the survival a_k = prod c_i falls below T"
)
def cum_threshold(arg: str | None = None) -> Policy:
    t = _parse("cum-threshold", arg, 0.3)

    def solo(conf: np.ndarray, accept_len: np.ndarray, step_time) -> np.ndarray:
        survival = np.cumprod(conf.astype(np.float64), axis=1)
        return leading_true(survival >= t)  # row-wise already

    def schedule(inp: StepInput) -> np.ndarray:
        return solo(inp.conf, None, inp.step_time)

    return Policy(
        name=f"cum-threshold:{t:g}", schedule=schedule, solo=solo, rowwise=True, solo_rows=True
    )
