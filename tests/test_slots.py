"""llama-server's slot choice in the simulator (specsim.sim.slots) and the cost of a pass after
a step's first (``pass_extra_ms``).

Why: with one KV stream per slot, where the requests in flight sit sets how many forward
passes a step costs (specsim.sim.ubatch); llama-server (b11434, ``get_available_slot``) gives a
task the free slot whose cached prompt shares the longest prefix with it above 0.1 of the
prompt, else the least recently released one (never used first, the last of equals).
"""

from __future__ import annotations

import numpy as np
import pytest

from specsim.errors import SpecsimError
from specsim.sim.cost.model import CostModel
from specsim.sim.cost.price import passes_table
from specsim.sim.simulate import replay
from specsim.sim.slots import LlamaSlots, RandomSlots, common_prefix
from specsim.sim.toy import iid_trace

TEMPLATE = list(range(100, 120))  # a chat template's shared head: 20 tokens


def _prompt(body: list[int]) -> list[int]:
    return TEMPLATE + body


def test_common_prefix_counts_the_shared_head():
    lcp = common_prefix([[1, 2, 3], [1, 2, 4, 5], [9]])
    assert lcp.tolist() == [[3, 2, 0], [2, 4, 0], [0, 0, 1]]


def test_a_fresh_server_fills_its_slots_from_the_last():
    """Every slot unused (t_last = -1): the LRU loop's ``<=`` keeps the last of equals, so a
    fresh server's first requests go to slots 7, 6, 5, ... (its logs: 'selected slot by LRU,
    t_last = -1', id 7 first)."""
    s = LlamaSlots(8, [_prompt([i] * 30) for i in range(4)])
    busy = np.zeros(8, bool)
    got = []
    for p in range(4):
        got.append(s.choose(busy, p))
        busy[got[-1]] = True
    assert got == [7, 6, 5, 4]


def test_a_shared_prefix_above_the_threshold_wins_over_recency():
    """A free slot whose cached prompt shares more than 10% of the new prompt is chosen over
    the least recently used one; among equal fractions the first slot in order; under the
    threshold the least recently released free slot."""
    same_head = [_prompt([1] * 10 + [2] * 10), _prompt([1] * 10 + [3] * 10)]
    other = [[7] * 60]  # nothing in common with the others
    s = LlamaSlots(4, same_head + other)
    busy = np.zeros(4, bool)
    assert s.choose(busy, 0) == 3  # fresh: the last slot
    s.release(np.array([3]), 1.0)
    assert s.choose(busy, 1) == 3  # 30 of 40 tokens shared: the cached slot, not an unused one
    s.release(np.array([3]), 2.0)
    assert s.choose(busy, 2) == 2  # nothing shared: an unused slot (t_last = -1) by recency
    s.release(np.array([2]), 3.0)
    busy[:] = [True, True, False, False]
    assert s.choose(busy, 0) == 3  # slot 3 holds prompt 1 (75%); slot 2 the unrelated one


def test_a_prefix_at_the_threshold_is_not_enough():
    prompts = [[1] * 1 + [2] * 9, [1] * 1 + [3] * 9]  # 1 of 10 tokens shared: 0.1, not > 0.1
    s = LlamaSlots(2, prompts)
    busy = np.zeros(2, bool)
    assert s.choose(busy, 0) == 1
    s.release(np.array([1]), 1.0)
    assert s.choose(busy, 1) == 0  # by recency: slot 0 never used


def test_a_new_run_counts_its_releases_after_the_last_runs():
    """The simulated clock starts at 0 each run; the server's does not: after ``start`` a
    release at 0.5 s is later than one at 9 s of the run before."""
    s = LlamaSlots(3, [[1, 2], [3, 4], [5, 6]], threshold=1.0)  # recency only
    s.release(np.array([0]), 9.0)
    s.attach(3, 3)
    s.release(np.array([1]), 0.5)
    s.release(np.array([2]), 0.7)
    assert s.choose(np.zeros(3, bool), 0) == 0  # slot 0's 9 s was the earliest release


def _cost(max_running: int, extra: float = 0.0) -> CostModel:
    return CostModel(
        name="slots", batch_tokens=np.array([1, 1024]), step_ms=np.array([5.0, 1200.0]),
        emit_per_token_ms=0.01, passes_by_slot=1, pass_extra_ms=extra, max_running=max_running,
    )  # fmt: skip


KW = {"serving": "v2", "record_tokens": False}


def test_replay_places_requests_by_the_servers_rule_and_carries_its_history():
    """Four requests in flight on eight slots with plain decoding: the lowest free slots keep
    them consecutive (one pass a step); the server's rule, started fresh, fills slots 7..4
    (consecutive too: the same run to the bit). After a run at eight in flight has used every
    slot, the same object at four in flight spreads them over slots holding prompts (more
    passes, a longer run): the server's history, carried from run to run."""
    tr = iid_trace(16, 40, gamma=4, alpha=0.7, seed=3)
    prompts = [_prompt([i % 3] * 20 + [i] * 20) for i in range(tr.n_requests)]
    kw = {"requests": 32, "seed": 5, "profile": _cost(8), **KW}
    low = replay(tr, "ar", concurrency=4, **kw)
    fresh = LlamaSlots(8, prompts)
    first = replay(tr, "ar", concurrency=4, slots=fresh, **kw)
    assert first.steps["duration_s"].sum() == low.steps["duration_s"].sum()
    assert (fresh.cached[:4] < 0).all() and (fresh.cached[4:] >= 0).all()
    server = LlamaSlots(8, prompts)
    full = replay(tr, "ar", concurrency=8, slots=server, **kw)
    assert (server.cached >= 0).all()
    assert server.t_last.max() > full.summary["sim_time_s"] - 1e-9  # released at the end
    spread = replay(tr, "ar", concurrency=4, slots=server, **kw)
    assert spread.steps["duration_s"].sum() > low.steps["duration_s"].sum()


def test_the_slots_must_match_the_trace_and_the_server():
    tr = iid_trace(4, 20, gamma=4, alpha=0.7, seed=1)
    with pytest.raises(SpecsimError, match="one token-id list per trace request"):
        replay(tr, "ar", slots=LlamaSlots(8, [[1, 2]] * 3), concurrency=2, requests=8,
               profile=_cost(8), **KW)  # fmt: skip


def test_random_slots_scatter_the_requests_the_same_way_for_a_seed():
    """A seeded random free slot: only free slots are drawn; the same seed places a run the
    same way (the same steps to the bit), another seed elsewhere; at four in flight on eight
    slots the scattered requests cost more passes than the lowest free slots' one a step."""
    slots = RandomSlots(8, seed=1)
    busy = np.zeros(8, dtype=bool)
    busy[[0, 2, 3, 7]] = True
    drawn = {slots.choose(busy, 0) for _ in range(200)}
    assert drawn == {1, 4, 5, 6}
    tr = iid_trace(16, 40, gamma=4, alpha=0.7, seed=3)
    kw = {"requests": 32, "seed": 5, "profile": _cost(8), **KW}
    low = replay(tr, "ar", concurrency=4, **kw)
    a = replay(tr, "ar", concurrency=4, slots=RandomSlots(8, seed=11), **kw)
    b = replay(tr, "ar", concurrency=4, slots=RandomSlots(8, seed=11), **kw)
    c = replay(tr, "ar", concurrency=4, slots=RandomSlots(8, seed=12), **kw)
    assert a.steps["duration_s"].sum() == b.steps["duration_s"].sum()
    assert a.steps["duration_s"].sum() > low.steps["duration_s"].sum()
    assert c.steps["duration_s"].sum() != a.steps["duration_s"].sum()
    with pytest.raises(SpecsimError, match="give max_running slots"):
        replay(tr, "ar", concurrency=4, slots=RandomSlots(6, seed=1), **kw)


def test_each_pass_after_the_first_pays_the_extra_cost():
    """``passes_table`` with ``extra_s``: three passes of 1 token cost the table at 1 three
    times plus two extras; the profile refuses the extra without passes by slot."""
    table = lambda n: 0.005 * n  # noqa: E731 - a step table, seconds at n tokens
    assert passes_table(table, [1, 1, 1], 0.001)(3) == pytest.approx(0.015 + 0.002)
    assert passes_table(table, [3], 0.001)(3) == pytest.approx(0.015)
    with pytest.raises(SpecsimError, match="pass_extra_ms"):
        CostModel(name="x", batch_tokens=np.array([1, 2]), step_ms=np.array([1.0, 2.0]),
                  pass_extra_ms=0.5)  # fmt: skip


def test_the_extra_pass_regressor_reads_a_step_table_with_unmatched_steps():
    """A step table from the server's log keeps ``passes`` as text ("3 1"); a step the log
    named no slots for has none (NaN): it counts no extra pass, rather than failing the fit
    (as a rescore of a server-clock grid did before)."""
    import pandas as pd

    from specsim.fidelity.llama.profile import term_columns

    frame = pd.DataFrame({"decoding": [2, 1, 2, 0], "batch_tokens": [4, 1, 2, 0],
                          "spec": ["ngram:3"] * 4, "passes": ["3 1", "1", np.nan, ""]})  # fmt: skip
    assert term_columns(frame)["pass_extra"].tolist() == [1.0, 0.0, 0.0, 0.0]
