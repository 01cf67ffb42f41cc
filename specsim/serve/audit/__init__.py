"""Audit a running server: does speculation change what it says?

One module per concern:

- ``config``: the ``check-lossless --server`` flags (``AuditConfig``), contexts, the state file;
  light to import (no numpy, no httpx), so ``specsim --help`` stays fast.
- ``client``: the HTTP side (generate on the audited server, score on the reference).
- ``law``: the audit at T > 0 (sequential tests of the output law).
- ``pipeline``: T > 0 generation and scoring as two stages, each with its own requests in
  flight (the audited server kept busy; the reference scoring on parallel slots).
- ``greedy``: the audit at T = 0 (greedy identity, each divergence triaged by the
  reference's own margin against a null measured without speculation).
- ``sweep``: audits over draft depth x concurrency x temperature in one verdict table.
- ``stats``: the T > 0 statistics (rank cells, PIT, looks, floors).
- ``proxy``: a mutant proxy that perturbs a server's law the way shipped bugs did.
- ``vocab``: tokens llama-server's stream cannot carry alone (banned on both servers).
"""
