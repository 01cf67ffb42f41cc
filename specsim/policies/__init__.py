"""Prefix schedulers, found by name in :data:`POLICIES` (see :mod:`specsim.policies.base`)."""

from specsim.policies.base import POLICIES, Policy, StepInput, check_lengths, get_policy

__all__ = ["POLICIES", "Policy", "StepInput", "check_lengths", "get_policy"]
