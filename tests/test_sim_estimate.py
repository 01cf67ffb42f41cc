"""The sweep's cost guess: orders cells the way their CPU time goes (issue #13)."""

from __future__ import annotations

from specsim.sim.cost.estimate import replay_cost_estimate


def test_more_work_costs_more():
    base = replay_cost_estimate("hw-aware", 400, 200.0, 8)
    assert replay_cost_estimate("hw-aware", 800, 200.0, 8) > base
    assert replay_cost_estimate("hw-aware", 400, 400.0, 8) > base
    assert replay_cost_estimate("mtp1", 400, 200.0, 8) < base  # no ranking
    assert replay_cost_estimate("ar", 400, 200.0, 8) > replay_cost_estimate("mtp1", 400, 200.0, 8)


def test_low_concurrency_cells_are_the_long_ones():
    """Per token, a batch of 64 costs far less than 8 requests; one request in flight walks
    its steps (cheap) unless the policy has no solo form (goodput)."""
    c8 = replay_cost_estimate("hw-aware", 400, 200.0, 8)
    c64 = replay_cost_estimate("hw-aware", 400, 200.0, 64)
    assert c8 > 3 * c64
    c1 = replay_cost_estimate("hw-aware", 400, 200.0, 1)
    assert replay_cost_estimate("goodput", 400, 200.0, 1) > 5 * c1
