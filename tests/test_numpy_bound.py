"""benchmarks/numpy_bound.py, the bare loop the simulator's speed is measured against, does the
engine's own accounting: it simulates exactly the engine's output tokens, steps and simulated
seconds (else its CPU time would not be a same-work reference). Serving model v1's loop was
retired with it (commit 77e1490)."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

from specsim.policies.base import get_policy
from specsim.sim.cost.profiles import get_profile
from specsim.sim.simulate import replay
from specsim.sim.workload import make_workload
from specsim.trace.synth import PROFILES, LogNormal, synth_trace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from numpy_bound import bound_loop_v2  # noqa: E402


@pytest.fixture(scope="module")
def trace():
    return synth_trace(
        n_requests=120,
        accept_profile=PROFILES["chat"],
        output_len=LogNormal(120, 0.5, 10, 600),
        prompt_len=LogNormal(1500, 1.0, 16, 16000),  # some prompts span several chunks
        seed=4,
    )


def _table_only():
    """The default profile (llama-3-8b-h100) without its measured-engine terms, which the bare
    loop does not do (it raises on them): its step table (read as CUDA-graph steps), draft
    curve, drafter prefill, scheduler and KV read stay. Its attention compute never outweighs
    its KV read at these draft lengths (GQA), so it is dropped with them."""
    import dataclasses

    cost = dataclasses.replace(
        get_profile("llama-3-8b-h100"), name="llama-3-8b-h100-table", verify_per_request_ms=0.0,
        draft_per_context_us=0.0, accept_per_token_ms=0.0, mixed_step_ms=0.0,
        attn_us_per_qk_ktoken=0.0,
    )  # fmt: skip
    assert not cost.has_engine_terms and not cost.is_2d
    assert cost.kv_read_us_per_ktoken and cost.draft_curve and cost.draft_prefill_us_per_token
    return cost


@pytest.mark.parametrize("policy", ["hw-aware", "oracle"])
@pytest.mark.parametrize(
    "load", [{"concurrency": 24, "requests": 150}, {"rate": 40.0, "requests": 150}]
)
def test_the_bound_simulates_what_the_engine_simulates(trace, policy, load):
    cost = _table_only()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = replay(trace, policy, profile=cost, seed=2, record_tokens=False, **load)
    s = res.summary
    wl = make_workload(trace, seed=2, **load)
    got = bound_loop_v2(trace, get_policy(policy), cost, wl)
    assert got == (s["output_tokens"], s["engine_steps"], s["sim_time_s"])
    # chunked prefill took part: some prompts span several steps
    assert int(wl.prompt_len.max()) > cost.max_batched_tokens
