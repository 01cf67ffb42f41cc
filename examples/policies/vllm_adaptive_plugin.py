"""vLLM's adaptive verification written as a plug-in from specsim's public blocks alone.

It decides what the built-in ``vllm-adaptive`` decides, step for step
(tests/test_policies_blocks.py checks it on random steps and on a replay); docs/policies.md walks
through it.

    PYTHONPATH=examples/policies specsim replay traces/chat.parquet \
        --policy vllm_adaptive_plugin:policy --concurrency 16
"""

import numpy as np

from specsim.policies import Policy, StepInput
from specsim.policies.blocks import (
    budget_search,
    draft_seconds,
    lagged_survival,
    survival,
    top_k_lengths,
)


def schedule(inp: StepInput) -> np.ndarray:
    r, gamma = inp.conf.shape
    if r == 0:
        return np.zeros(0, dtype=np.int64)
    lagged = lagged_survival(inp, unknown=1.0)  # two steps old; a new request counts as certain
    budget = budget_search(lagged, r, inp.step_time, draft_seconds(inp))  # drafting priced
    return top_k_lengths(survival(inp.conf, inp.survival), budget, r, gamma)  # live top-B


policy = Policy(
    name="my-vllm-adaptive",
    schedule=schedule,
    zos=True,  # the budget runs ahead, overlapped with the previous step
    needs=frozenset({"lagged_conf", "survival", "lagged_survival", "lag_known", "draft_time"}),
)
