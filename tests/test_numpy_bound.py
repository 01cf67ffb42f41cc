"""benchmarks/numpy_bound.py, the bare loop the simulator's speed is measured against, does the
engine's own accounting: under both serving models it simulates exactly the engine's output
tokens, steps and simulated seconds (else its CPU time would not be a same-work reference)."""

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
from numpy_bound import bound_loop, bound_loop_v2  # noqa: E402


@pytest.fixture(scope="module")
def trace():
    return synth_trace(
        n_requests=120,
        accept_profile=PROFILES["chat"],
        output_len=LogNormal(120, 0.5, 10, 600),
        prompt_len=LogNormal(1500, 1.0, 16, 16000),  # some prompts span several chunks
        seed=4,
    )


@pytest.mark.parametrize("serving", ["v1", "v2"])
@pytest.mark.parametrize("policy", ["hw-aware", "oracle"])
@pytest.mark.parametrize(
    "load", [{"concurrency": 24, "requests": 150}, {"rate": 40.0, "requests": 150}]
)
def test_the_bound_simulates_what_the_engine_simulates(trace, serving, policy, load):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = replay(
            trace, policy, profile="h100-dense-8b", seed=2, serving=serving,
            record_tokens=False, **load,
        )  # fmt: skip
    s = res.summary
    cost = get_profile("h100-dense-8b").for_serving(serving)
    wl = make_workload(trace, seed=2, **load)
    pol = get_policy(policy)
    if serving == "v1":
        got = bound_loop(
            trace, pol, cost, wl, cost.max_running, cost.kv_tokens, cost.prefill_budget
        )
    else:
        got = bound_loop_v2(trace, pol, cost, wl)
    assert got == (s["output_tokens"], s["engine_steps"], s["sim_time_s"])
    if serving == "v2":  # chunked prefill took part: some prompts span several steps
        assert int(wl.prompt_len.max()) > cost.max_batched_tokens
