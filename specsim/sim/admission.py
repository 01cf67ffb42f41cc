"""The admission rule, written once: the simulated engine's (:class:`specsim.sim.engine.Engine`;
specsim's own torch engine, which shared it, was retired at commit 574e4c8).

FIFO, no skipping: queued requests are admitted head first while a running slot is free, the
request's KV reservation fits what is left of the cache, and its prompt fits what is left of the
step's prefill budget (the first request admitted in a step goes whatever its prompt, so a long
prompt is never starved). A request that does not fit blocks the queue.
"""

from __future__ import annotations


def reservation(prompt: int, output: int, gamma: int) -> int:
    """KV tokens a request reserves on admission: its prompt, its whole output and one block
    of drafts (clairvoyant: the output length is known up front)."""
    return prompt + output + gamma


def fits(kv_used: int, need: int, kv_cap: int, others: bool, prompt: int, budget: int) -> bool:
    """Whether the queue's head is admitted now: its reservation ``need`` fits the cache and,
    unless it is the step's first admission (``others`` False), its prompt fits the budget."""
    return kv_used + need <= kv_cap and not (others and prompt > budget)
