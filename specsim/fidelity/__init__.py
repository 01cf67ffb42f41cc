"""Fidelity: the simulator against a real engine, cell by cell, on the same prompts, load and
clock (``specsim validate``; the method in docs/fidelity.md).

- :mod:`~specsim.fidelity.config`: ``ValidationConfig`` (every knob; the command's flags and
  ``config.json``), the grid's cells and a real run's spec;
- :mod:`~specsim.fidelity.grid`: the grid, phase by phase;
- :mod:`~specsim.fidelity.real` and :mod:`~specsim.fidelity.simulated`: the two sides;
- :mod:`~specsim.fidelity.metrics` and :mod:`~specsim.fidelity.assemble`: what is compared
  and the tables;
- :mod:`~specsim.fidelity.report`, :mod:`~specsim.fidelity.tables`,
  :mod:`~specsim.fidelity.plot`, :mod:`~specsim.fidelity.ablation`: the report page, its
  verdicts and figure, and what each cost term buys (all torch-free).
"""
