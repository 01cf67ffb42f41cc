"""Prefix schedulers, found by name in :data:`POLICIES` (see :mod:`specsim.policies.base`).

Built-in: ``ar``, ``static:K``, ``mtp1``, ``full``, ``threshold:T``, ``cum-threshold:T``,
``hw-aware``, ``hw-aware-global``, ``zos``, ``goodput``, ``oracle``, and the engines' own
rules (``vllm-adaptive``, :mod:`specsim.policies.engines`). Add your own with
``@POLICIES.register("name")`` or pass ``module:callable`` wherever a policy name is accepted.
"""

from specsim.policies import (  # noqa: F401 (register)
    calibrated,
    engines,
    goodput,
    hw_aware,
    oracle,
    static,
    threshold,
)
from specsim.policies.base import POLICIES, Policy, StepInput, check_lengths, get_policy

__all__ = ["POLICIES", "Policy", "StepInput", "check_lengths", "get_policy"]
