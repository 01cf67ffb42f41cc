"""``oracle``: verifies exactly the drafts that will be accepted. An upper bound, not a scheduler.

It reads the truth (``accept_len``), so no verified token is ever wasted and no accepted one is
left out. It is anticipating by construction (its choice depends on the drafts themselves), which
is why it claims nothing about losslessness: it bounds what any confidence-based scheduler could
reach on the same trace and cost model.
"""

from __future__ import annotations

import numpy as np

from specsim.errors import SpecsimError
from specsim.policies.base import POLICIES, Policy, StepInput


def oracle_lengths(inp: StepInput) -> np.ndarray:
    if inp.accept_len is None:
        raise SpecsimError("policy 'oracle' needs accept_len; only the simulator can run it")
    return np.minimum(np.asarray(inp.accept_len, dtype=np.int64), inp.gamma)


@POLICIES.register("oracle", help="verify exactly what will be accepted (upper bound)")
def oracle(arg: str | None = None) -> Policy:
    POLICIES.no_arg("oracle", arg)
    return Policy(
        name="oracle",
        schedule=oracle_lengths,
        lossless=False,
        needs=frozenset({"accept_len"}),
        solo=lambda conf, accept_len, step_time: np.minimum(
            np.asarray(accept_len, dtype=np.int64), conf.shape[1]
        ),
        rowwise=True,
        solo_rows=True,
    )
