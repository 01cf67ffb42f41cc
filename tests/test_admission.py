"""The admission rule is written once (specsim.sim.admission) and the simulator obeys it: it
admits exactly the requests the rule says, step by step, on a queue built to hit every branch
(KV full, prefill budget, the first request whatever its prompt, slots). The torch engine that
shared it was retired at commit 574e4c8."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np

from specsim.sim.admission import fits, reservation
from specsim.sim.cost.model import CostModel
from specsim.sim.simulate import replay
from specsim.sim.toy import iid_trace

ROOT = Path(__file__).resolve().parents[1] / "specsim"


def test_the_rule():
    assert reservation(10, 20, 7) == 37
    assert fits(0, 37, 37, False, 10, 0)  # exactly fills the cache
    assert not fits(1, 37, 37, False, 10, 10**6)  # over the cache
    assert fits(0, 37, 100, False, 500, 0)  # the step's first admission: any prompt
    assert not fits(0, 37, 100, True, 500, 499)  # later ones: the prompt must fit the budget
    assert fits(0, 37, 100, True, 499, 499)


def _simulated_admissions(trace, kv_tokens, prefill_budget, max_running):
    flat = CostModel("flat", np.array([1, 4096]), [10.0, 10.0])
    res = replay(
        trace, "static:2", concurrency=trace.n_requests, profile=flat, kv_tokens=kv_tokens,
        prefill_budget=prefill_budget, max_running=max_running, record_tokens=False,
        serving="v1",  # the rule both engines share is v1's (v2 has tests/test_serving_v2.py)
    )  # fmt: skip
    return res.requests  # one row per job, in arrival (queue) order


def _rule_admissions(jobs, gamma, kv_tokens, prefill_budget, max_running, step_s):
    """The same queue walked with the rule alone: which step admits each job. With a flat
    10-ms step, every request runs to its end in a known number of steps."""
    prompt = jobs["prompt_len"].to_numpy(int)
    out = jobs["output_tokens"].to_numpy(int)
    admitted = np.full(len(jobs), np.nan)
    queue = list(range(len(jobs)))
    running: dict[int, int] = {}  # job -> tokens left to emit
    kv, t = 0, 0.0
    while queue or running:
        budget, new = prefill_budget, []
        while queue and len(running) + len(new) < max_running:
            j = queue[0]
            need = reservation(prompt[j], out[j], gamma)
            if not fits(kv, need, kv_tokens, bool(new), prompt[j], budget):
                break
            queue.pop(0)
            kv += need
            budget -= prompt[j]
            admitted[j] = t
            new.append(j)
        for j in list(running):  # static:2 on an all-accepting trace emits 3 a step
            running[j] -= 3
        for j in new:
            running[j] = out[j] - 1  # the prefill step emits the first token
        for j in [j for j, left in running.items() if left <= 0]:
            kv -= reservation(prompt[j], out[j], gamma)
            del running[j]
        t += step_s
    return admitted


def test_the_simulator_admits_what_the_rule_says():
    trace = iid_trace(12, 13, gamma=4, alpha=1.0, seed=3)  # every draft accepted
    rng = np.random.default_rng(0)
    trace.prompt_len[:] = rng.integers(8, 300, trace.n_requests)
    for kv, budget, slots in ((1200, 400, 5), (800, 100, 12), (10_000, 50, 3)):
        jobs = _simulated_admissions(trace, kv, budget, slots)
        want = _rule_admissions(jobs, trace.block_size, kv, budget, slots, 0.010)
        np.testing.assert_allclose(
            jobs["admitted_s"].to_numpy(), want, atol=1e-9, err_msg=f"kv={kv} budget={budget}"
        )


def test_the_engine_calls_the_one_rule():
    """The engine does not restate the rule: it imports it from specsim.sim.admission."""
    for rel in ("sim/engine.py",):
        tree = ast.parse((ROOT / rel).read_text())
        names = {
            a.name
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.module == "specsim.sim.admission"
            for a in n.names
        }
        assert {"fits", "reservation"} <= names, rel
