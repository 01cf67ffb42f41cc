"""A cheap guess of how much CPU one replay will take, for ordering a sweep's cells.

A sweep that hands its longest cells out first finishes sooner on several workers; it needs
their relative cost before running them. The engine's CPU time is about (engine steps) x (cost
of one step), and both follow from the load (issue #13, benchmarks/README.md):

- steps ~ output tokens / (running requests x tokens per request-step); tokens per
  request-step is ~1 for ``ar`` and ~2 for speculative policies (the shipped traces' tau are
  1.2-6; 2 keeps the guess conservative);
- a step costs ~``STEP_US`` fixed plus ``PER_REQUEST_US`` per running request (numpy over the
  batch), and a ranking policy (``hw-aware``, ``zos``, ``hw-aware-global``) adds its own;
- with ONE request in flight and a policy with a ``solo`` form, the engine walks a request's
  steps without an event each (``Engine._solo_walk_v2``): a few microseconds a step plus a
  fixed cost per request.

The figures are rough (measured on the 2-core development VM) and only their ratios matter.
"""

from __future__ import annotations

STEP_US = 25.0  # fixed engine cost of one step (SimPy event, ~20 numpy calls, log row)
PER_REQUEST_US = 0.12  # per running request per step
RANKING_STEP_US = 15.0  # a ranking policy's fixed cost per step
RANKING_PER_REQUEST_US = 0.1
SOLO_STEP_US = 3.0  # a walked step of a lone request
SOLO_REQUEST_US = 150.0  # per request: prefill and last steps, the walk's setup
RANKING = frozenset({"hw-aware", "zos", "hw-aware-global"})
NO_SOLO = frozenset({"goodput"})


def replay_cost_estimate(
    policy: str,
    requests: int,
    mean_output_tokens: float,
    concurrency: float = 1.0,
) -> float:
    """Relative CPU seconds of replaying ``requests`` jobs of ``mean_output_tokens`` each with
    about ``concurrency`` requests running (closed loop C; for an open loop, rate x mean
    latency or any guess). Only the ratio between two estimates means anything."""
    name = policy.split(":", 1)[0]
    r = max(1.0, min(float(concurrency), float(requests)))
    tau = 1.0 if name == "ar" else 2.0
    tokens = float(requests) * float(mean_output_tokens)
    steps = tokens / (r * tau)
    if r <= 1.0 and name not in NO_SOLO:
        return (steps * SOLO_STEP_US + requests * SOLO_REQUEST_US) * 1e-6
    per_step = STEP_US + PER_REQUEST_US * r
    if name in RANKING:
        per_step += RANKING_STEP_US + RANKING_PER_REQUEST_US * r
    return steps * per_step * 1e-6
