"""Fidelity: the simulator against a real engine, cell by cell, on the same prompts, load and
clock (``specsim validate``; the method in docs/llama-cpp.md).

- :mod:`~specsim.fidelity.llama`: llama.cpp's llama-server, the independent reference (its
  grid, calibration, traces, report and the held-out definition);
- :mod:`~specsim.fidelity.repeats`: how many runs a cell needs (the interval rule, and runs
  interleaved across settings).

The torch engine's in-sample grid was retired in house v3 (reports/fidelity keeps its record).
"""
