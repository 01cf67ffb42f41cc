"""The engines' own rules (specsim.policies.engines) against steps worked by hand.

vllm-adaptive, two requests, block 3. Lagged confidences r0 (0.9, 0.8, 0.5), r1 (0.6, 0.5, 0.5):
survivals 0.9, 0.72, 0.36 and 0.6, 0.3, 0.15, ranked 0.9, 0.72, 0.6, 0.36, 0.3, 0.15. Verify
cost (table at R + B tokens) 10, 10, 14, 20, 26, 32, 38 ms at 2..8 tokens.

- Without drafting in the denominator (zos's budget): Theta = 2/10, 2.9/10, 3.62/14, 4.22/20
  = 0.200, 0.290, 0.259, 0.211, then lower: budget 1.
- vLLM's, with a 10 ms drafter: 2/20, 2.9/20, 3.62/24, 4.22/30, 4.58/36 = 0.100, 0.145, 0.151,
  0.141, 0.127, then lower: budget 2 (a fixed draft cost makes a larger batch relatively
  cheaper).
- Allocation from the LIVE confidences r0 (0.5, 0.5, 0.5), r1 (0.95, 0.9, 0.9): survivals 0.5,
  0.25, 0.125 and 0.95, 0.855, 0.77: the top 2 are both r1's: lengths (0, 2).

trtllm-confidence, the same step (F = 1 draft always verified). The budget reads the lagged
survivals: the always-verified first positions give 0.9 + 0.6 = 1.5, so tau(0) = 2 + 1.5 = 3.5 at
R * (F + 1) = 4 tokens; the other candidates, ranked: 0.72, 0.36, 0.3, 0.15.

- On the table above (14, 20, 26, 32, 38 ms at 4..8 tokens): Theta = 3.5/14, 4.22/20, 4.58/26,
  4.88/32, 5.03/38 = 0.250, 0.211, 0.176, 0.153, 0.132: budget 0 (0.250 is not within 4% of the
  full block's 0.132 * 1.04 = 0.138): lengths (1, 1).
- On a flatter table (14, 15, 16, 17, 18 ms at 4..8): Theta = 0.2500, 0.2813, 0.2863, 0.2871,
  0.2794: the argmax is 3, but 0.2871 < 0.2794 * 1.04 = 0.2906, so the guard verifies the whole
  block: lengths (3, 3). With G = 0.01 (0.2794 * 1.01 = 0.2822 < 0.2871) or 0 the budget stays 3:
  the live candidates above the floor, r0 0.25, 0.125 and r1 0.855, 0.7695, give their top 3 to
  r1 twice and r0 once: lengths (1 + 1, 1 + 2) = (2, 3).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from specsim.errors import SpecsimError
from specsim.policies import get_policy
from specsim.policies.base import StepInput
from specsim.policies.blocks import budget_search
from specsim.policies.engines import (
    draft_len_for_batch,
    parse_draft_len_schedule,
    trtllm_allocate,
    trtllm_verify_budget,
    vllm_lagged_survival,
)

LAGGED = np.array([[0.9, 0.8, 0.5], [0.6, 0.5, 0.5]])
LIVE = np.array([[0.5, 0.5, 0.5], [0.95, 0.9, 0.9]])
TABLE_MS = {2: 10, 3: 10, 4: 14, 5: 20, 6: 26, 7: 32, 8: 38}
FLAT_MS = {4: 14, 5: 15, 6: 16, 7: 17, 8: 18}


def _table(ms):
    def step_time(batch):
        return np.vectorize(lambda x: ms[int(x)] / 1000)(np.asarray(batch)).astype(np.float64)

    return step_time


_step_time = _table(TABLE_MS)


def _inp(draft_s, known=None, step_time=_step_time, live=LIVE):
    return StepInput(
        conf=live, step_time=step_time, lagged_conf=LAGGED, lag_known=known,
        draft_time=(lambda k: draft_s if k > 0 else 0.0) if draft_s is not None else None,
    )  # fmt: skip


def test_budget_search_by_hand():
    surv = np.cumprod(LAGGED, axis=1)
    assert budget_search(surv, 2, _step_time) == 1
    assert budget_search(surv, 2, _step_time, draft_s=0.010) == 2


def test_vllm_adaptive_worked_step():
    pol = get_policy("vllm-adaptive")
    assert pol.zos and pol.lossless and {"draft_time", "lag_known"} <= pol.needs
    assert pol(_inp(0.010)).tolist() == [0, 2]
    assert pol(_inp(None)).tolist() == [0, 1]  # no drafting priced: zos's budget
    zos = get_policy("zos")(_inp(None))
    assert zos.tolist() == [0, 1]


def test_a_request_without_confidences_is_seeded_with_one():
    """vLLM seeds a new request's confidences with 1.0: r1 unknown ranks its three candidates
    first (1, 1, 1, then r0's 0.9, 0.72, 0.36). With a 12 ms drafter: Theta 2/22, 3/22, 4/26,
    5/32, 5.9/38 = 0.091, 0.136, 0.154, 0.156, 0.155: budget 3 (with r1's real lagged row:
    2)."""
    inp = _inp(0.012, known=np.array([True, False]))
    surv = vllm_lagged_survival(inp).reshape(2, 3)
    np.testing.assert_allclose(surv[0], [0.9, 0.72, 0.36])
    np.testing.assert_allclose(surv[1], [1.0, 1.0, 1.0])
    assert budget_search(surv, 2, _step_time, 0.012) == 3
    assert get_policy("vllm-adaptive")(inp).tolist() == [0, 3]  # top 3 of the live rows: r1's
    assert get_policy("vllm-adaptive")(_inp(0.012)).tolist() == [0, 2]


def test_vllm_adaptive_replays_and_prices_its_drafting():
    """In the simulator the rule gets the engine's draft cost: with a drafter 100x as costly
    the budget grows (a fixed cost is amortised over more tokens), never shrinks."""
    from dataclasses import replace

    from specsim.sim.cost.profiles import get_profile
    from specsim.sim.simulate import replay
    from specsim.sim.toy import iid_trace

    tr = iid_trace(24, 60, gamma=7, alpha=0.6, seed=3)
    base = get_profile("vllm-v4-flash-tp4-b300")
    dear = replace(base, draft_curve=tuple((r, m * 100) for r, m in base.draft_curve))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cheap = replay(tr, "vllm-adaptive", concurrency=8, requests=24, profile=base).summary
        costly = replay(tr, "vllm-adaptive", concurrency=8, requests=24, profile=dear).summary
    assert costly["verified_draft_tokens"] > cheap["verified_draft_tokens"]


def test_llama_dspark_worked_step():
    """llama.cpp's draft-dspark cut (docs/llama-cpp-dspark.md row 13): drafts before the first
    confidence below P; P = 0 keeps the block; N caps it; a cut at position 1 is no draft."""
    import pytest

    from specsim.errors import SpecsimError

    conf = np.array([[0.9, 0.6, 0.4, 0.8], [0.3, 0.9, 0.9, 0.9], [0.7, 0.7, 0.7, 0.7]])
    inp = StepInput(conf=conf, step_time=_step_time)
    assert get_policy("llama-dspark:0.5")(inp).tolist() == [2, 0, 4]
    assert get_policy("llama-dspark:0.5:3")(inp).tolist() == [2, 0, 3]
    assert get_policy("llama-dspark")(inp).tolist() == [4, 4, 4]
    assert get_policy("llama-dspark:0.65")(inp).tolist() == [1, 0, 4]
    pol = get_policy("llama-dspark:0.5")
    assert pol.rowwise and pol.lossless
    assert pol.solo(conf, np.zeros(3), _step_time).tolist() == [2, 0, 4]
    for bad in ("llama-dspark:1.5", "llama-dspark:x", "llama-dspark:0.5:-1", "llama-dspark:1:2:3"):
        with pytest.raises(SpecsimError, match="llama-dspark"):
            get_policy(bad)


# ---------------------------------------------------------------- TensorRT-LLM
def test_trtllm_confidence_worked_step():
    """The module docstring's step: budget 0 on the steep table, the full-block guard on the
    flat one, the top 3 with a smaller guard."""
    lag_surv = np.cumprod(LAGGED, axis=1)
    assert trtllm_verify_budget(lag_surv, _step_time, 0.04) == 0
    assert trtllm_verify_budget(lag_surv, _table(FLAT_MS), 0.04) == 4  # the guard: full block
    assert trtllm_verify_budget(lag_surv, _table(FLAT_MS), 0.01) == 3
    assert trtllm_verify_budget(lag_surv, _table(FLAT_MS), 0.0) == 3
    pol = get_policy("trtllm-confidence")
    assert pol.zos and pol.lossless and "lag_known" in pol.needs
    assert pol(_inp(None)).tolist() == [1, 1]
    assert pol(_inp(None, step_time=_table(FLAT_MS))).tolist() == [3, 3]
    flat = _table(FLAT_MS)
    assert get_policy("trtllm-confidence:0.01")(_inp(None, step_time=flat)).tolist() == [2, 3]
    # drafting is not in TensorRT-LLM's Theta: a 500 ms drafter changes nothing
    assert get_policy("trtllm-confidence:0")(_inp(0.5, step_time=flat)).tolist() == [2, 3]


def test_trtllm_confidence_floor_and_epsilon():
    """F = 2 on the steep table: the floor's survivals 0.9 + 0.72 and 0.6 + 0.3 make tau(0) =
    2 + 2.52 = 4.52 at 6 tokens; the candidates 0.36, 0.15 give Theta 4.52/26 = 0.174, 4.88/32 =
    0.153, 5.03/38 = 0.132: budget 0, lengths (2, 2). A live survival below 1e-6 is never
    verified: r0 (0.5, 1e-6, 0.5) has survivals 0.5, 5e-7, 2.5e-7, so under the flat table's
    full-block budget it keeps its floor only: (1, 3)."""
    assert get_policy("trtllm-confidence:0.04:2")(_inp(None)).tolist() == [2, 2]
    live = np.array([[0.5, 1e-6, 0.5], [0.95, 0.9, 0.9]])
    flat = _table(FLAT_MS)
    assert get_policy("trtllm-confidence")(_inp(None, step_time=flat, live=live)).tolist() == [1, 3]


def test_trtllm_allocation_breaks_ties_by_position():
    """Live survivals r0 (1, 0.5, 0.5), r1 (1, 0.5, 0.05), budget 2 above a floor of 1: three
    candidates tie at 0.5. TensorRT-LLM takes (position, request) order: (1, r0), (1, r1): lengths
    (2, 2); specsim's and vLLM's (request, position) order would give r0 both: (3, 1)."""
    live = np.array([[1.0, 0.5, 0.5], [1.0, 0.5, 0.05]])
    assert trtllm_allocate(live, 2).tolist() == [2, 2]
    assert trtllm_allocate(live, 0).tolist() == [1, 1]
    assert trtllm_allocate(live, 9).tolist() == [3, 3]


def test_trtllm_schedule_worked_steps():
    """draft_len_schedule {1: 7, 8: 4, 32: 2} (TensorRT-LLM: the value holds for batch sizes up
    to its key, none above the last): 1 request drafts 7, 2-8 draft 4, 9-32 draft 2, 33+ none."""
    sched = parse_draft_len_schedule("32=2,1=7,8=4")
    assert sched == ((1, 7), (8, 4), (32, 2))
    by_batch = {b: draft_len_for_batch(sched, b) for b in (1, 2, 8, 9, 32, 33)}
    assert by_batch == {1: 7, 2: 4, 8: 4, 9: 2, 32: 2, 33: 0}
    pol = get_policy("trtllm-schedule:32=2,1=7,8=4")
    assert pol.name == "trtllm-schedule:1=7,8=4,32=2" and pol.lossless and not pol.decides
    for r, k in by_batch.items():
        inp = StepInput(conf=np.full((r, 7), 0.5), step_time=_step_time)
        assert pol.plan(inp) == k
        assert pol(inp).tolist() == [k] * r
    short = StepInput(conf=np.full((1, 3), 0.5), step_time=_step_time)
    assert pol.plan(short) == 3 and pol(short).tolist() == [3]  # capped at the trace's block
    drafted = StepInput(conf=np.full((2, 7), 0.5), step_time=_step_time, drafted=1)
    assert pol(drafted).tolist() == [1, 1]  # never more than was drafted
    bad_args = (":x", ":0=3", ":4=-1", ":4=2,4=3", ":4", "")
    for bad in (f"trtllm-schedule{a}" for a in bad_args):
        with pytest.raises(SpecsimError, match="trtllm-schedule"):
            get_policy(bad)


def test_trtllm_schedule_replays_as_its_static_length():
    """A schedule that drafts 3 at every batch size plans 3 drafts every step: the simulator
    gives static:3's run to the bit (drafting charged by what is drafted, no scheduler time)."""
    from specsim.sim.simulate import replay
    from specsim.sim.toy import iid_trace

    tr = iid_trace(24, 40, gamma=5, alpha=0.7, seed=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = replay(tr, "trtllm-schedule:1000=3", concurrency=4, requests=24).summary
        b = replay(tr, "static:3", concurrency=4, requests=24).summary
        off = replay(tr, "trtllm-schedule:2=3", concurrency=4, requests=24).summary
    assert a["throughput_tok_s"] == b["throughput_tok_s"]
    assert a["verified_draft_tokens"] == b["verified_draft_tokens"]
    assert off["verified_draft_tokens"] < a["verified_draft_tokens"]  # 3+ running: no drafts


# ---------------------------------------------------------------- SGLang
def test_sglang_dspark_worked_step():
    """SGLang's default (static) DSPARK verify window is gamma + 1 tokens: every draft of the
    block, every step; --speculative-dspark-block-size G drafts G."""
    conf = np.array([[0.9, 0.1, 0.9, 0.9, 0.9], [0.2, 0.2, 0.2, 0.2, 0.2]])
    inp = StepInput(conf=conf, step_time=_step_time)
    assert get_policy("sglang-dspark")(inp).tolist() == [5, 5]
    pol = get_policy("sglang-dspark:3")
    assert pol.name == "sglang-dspark:3" and pol.draft_len == 3 and pol.lossless
    assert pol(inp).tolist() == [3, 3]
    assert get_policy("sglang-dspark:9")(inp).tolist() == [5, 5]  # capped at the trace's block
    for bad in ("sglang-dspark:0", "sglang-dspark:x", "sglang-dspark:-2"):
        with pytest.raises(SpecsimError, match="sglang-dspark"):
            get_policy(bad)


def test_engine_rule_docs_cite_file_and_commit():
    import re

    for spec in ("vllm-adaptive", "trtllm-confidence", "trtllm-schedule:1=1", "sglang-dspark"):
        doc = get_policy(spec).doc
        assert re.search(r"[0-9a-f]{40}", doc) and ".py" in doc, spec
