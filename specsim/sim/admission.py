"""The KV a request reserves on admission, written once (the running batch's ``RES`` field and
``kv="reserve"``'s admission test read it).

Serving model v1's admission rule (FIFO under a per-step prefill budget, the reservation
checked against the cache) was retired with it; it runs at commit 77e1490. The serving
model's admissions are :mod:`specsim.sim.batching`'s.
"""

from __future__ import annotations


def reservation(prompt: int, output: int, gamma: int) -> int:
    """KV tokens a request reserves on admission: its prompt, its whole output and one block
    of drafts (clairvoyant: the output length is known up front)."""
    return prompt + output + gamma
