"""The real engine: a speculative-decoding server on torch, sibling of the simulated one.

``specsim.sim`` simulates a serving engine; this package IS one, small and real: continuous
batching over a torch target (``target.py``: one flattened forward over every request's new
tokens with a per-slot KV cache), batched drafting (``proposers.py``: the DSpark drafter or
prompt lookup), the SAME policy registry the simulator schedules with, and the same cost
vocabulary (``profile.py`` measures this engine's own step as an SPS profile the simulator
reads). ``specsim validate`` runs both on the same workload and compares them.

Everything here imports torch; nothing below this package may import it (docs/architecture.md).
"""
