"""``specsim tune``: which knobs to set on an engine at a load, and the config to paste.

- :mod:`~specsim.analysis.tune.grid`: the settings each engine offers (vLLM, TensorRT-LLM,
  SGLang, llama.cpp) as specsim policies;
- :mod:`~specsim.analysis.tune.run`: every setting replayed over common seeds at the load;
- :mod:`~specsim.analysis.tune.score`: paired intervals, ties, the recommendation and its rule;
- :mod:`~specsim.analysis.tune.configs`: the engine's own config for a setting, keys as the
  engine's source names them.
"""
