"""Policies that ignore confidences: ``ar``, ``static:K`` (``mtp1`` = ``static:1``), ``full``.

A constant length is trivially non-anticipating, hence lossless with any correct verifier. They
decide nothing (no scheduler time) and tell the engine how much to draft: ``ar`` nothing (no
drafter forward), ``mtp1`` one token (a one-token drafter, as the paper's MTP-1 baseline),
``static:K`` K tokens, ``full`` the block.
"""

from __future__ import annotations

import numpy as np

from specsim.errors import SpecsimError
from specsim.policies.base import POLICIES, Policy, StepInput


def _constant(name: str, k: int | None) -> Policy:
    def schedule(inp: StepInput) -> np.ndarray:
        length = inp.gamma if k is None else min(k, inp.gamma)
        return np.full(inp.n_requests, length, dtype=np.int64)

    def solo(conf: np.ndarray, accept_len: np.ndarray, step_time) -> np.ndarray:
        length = conf.shape[1] if k is None else min(k, conf.shape[1])
        return np.full(conf.shape[0], length, dtype=np.int64)

    return Policy(
        name=name,
        schedule=schedule,
        solo=solo,
        rowwise=True,
        draft_len=k,
        decides=False,
        solo_rows=True,
    )


@POLICIES.register("ar", help="no speculation: verify no drafts, one token per step")
def ar(arg: str | None = None) -> Policy:
    POLICIES.no_arg("ar", arg)
    return _constant("ar", 0)


@POLICIES.register("static", help="static:K: verify the first K drafts of every request")
def static(arg: str | None = None) -> Policy:
    if arg is None:
        raise SpecsimError("policy 'static' needs a length: static:K, for example static:3")
    try:
        k = int(arg)
    except ValueError:
        raise SpecsimError(f"static:{arg}: K must be a non-negative integer") from None
    if k < 0:
        raise SpecsimError(f"static:{arg}: K must be a non-negative integer")
    return _constant(f"static:{k}", k)


@POLICIES.register("mtp1", help="static:1, the DSpark paper's production baseline (MTP-1)")
def mtp1(arg: str | None = None) -> Policy:
    POLICIES.no_arg("mtp1", arg)
    return _constant("mtp1", 1)


@POLICIES.register("full", help="verify the whole draft block of every request")
def full(arg: str | None = None) -> Policy:
    POLICIES.no_arg("full", arg)
    return _constant("full", None)
