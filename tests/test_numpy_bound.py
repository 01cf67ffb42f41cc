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


@pytest.mark.parametrize("policy", ["hw-aware", "oracle"])
@pytest.mark.parametrize(
    "load", [{"concurrency": 24, "requests": 150}, {"rate": 40.0, "requests": 150}]
)
def test_the_bound_simulates_what_the_engine_simulates(trace, policy, load):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = replay(
            trace, policy, profile="h100-dense-8b", seed=2, record_tokens=False, **load
        )  # fmt: skip
    s = res.summary
    cost = get_profile("h100-dense-8b")
    wl = make_workload(trace, seed=2, **load)
    got = bound_loop_v2(trace, get_policy(policy), cost, wl)
    assert got == (s["output_tokens"], s["engine_steps"], s["sim_time_s"])
    # chunked prefill took part: some prompts span several steps
    assert int(wl.prompt_len.max()) > cost.max_batched_tokens
