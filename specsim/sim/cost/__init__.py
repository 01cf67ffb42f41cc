"""What a step costs: the cost model and everything that builds or reads one.

- :mod:`~specsim.sim.cost.model`: ``CostModel``, a step's time from a token batch (and a mean
  context), with the drafter's, the scheduler's and the engine's own terms;
- :mod:`~specsim.sim.cost.profiles`: the built-in profiles by name (built deployments, measured
  tables) and profile CSV files;
- :mod:`~specsim.sim.cost.build` / :mod:`~specsim.sim.cost.build_profile`: ``profile build``,
  the one way a deployment's step is priced (measured operators, sourced facts);
- :mod:`~specsim.sim.cost.profile_csv`: the profile file format and the one rule per kind of
  value (a step cost, a size, a context) every reader applies;
- :mod:`~specsim.sim.cost.profile_import` / :mod:`~specsim.sim.cost.profile_export`: engines'
  measured tables in (vLLM, TensorRT-LLM, SGLang, plain tables, bench runs) and out;
- :mod:`~specsim.sim.cost.accelerators`, :mod:`~specsim.sim.cost.deployments`,
  :mod:`~specsim.sim.cost.transfer`: GPUs and deployments from public facts, and a measured
  table carried from one deployment to another;
- :mod:`~specsim.sim.cost.price`: what one engine step costs (``StepPrice.seconds``), the one
  function that prices a step, for the serving model and the non-anticipating bound alike;
- :mod:`~specsim.sim.cost.steptime`, :mod:`~specsim.sim.cost.estimate`: the per-trace-row
  table the engine gathers, and the quick estimates of a run's cost.
"""
