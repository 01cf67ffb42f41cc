"""The losslessness suite: prove verifiers and prefix schedulers keep the target's law.

- :mod:`~specsim.lossless.toy`: tiny table LMs (target p, draft q, Markov confidence head);
- :mod:`~specsim.lossless.verifiers`: reference verifiers driven by explicit uniforms;
- :mod:`~specsim.lossless.uniforms`: exact integration of a verifier over its uniforms (every
  breakpoint found by scanning and bisection, or a loud refusal);
- :mod:`~specsim.lossless.oracle`: the exact law of a request's output under a scheduler;
- :mod:`~specsim.lossless.sampling` and :mod:`~specsim.lossless.stats`: chunked sampled checks,
  the sequential G-test (family-wise false-alarm rate <= 1e-6 per run);
- :mod:`~specsim.lossless.mutants`: the catalogue of broken implementations;
  :mod:`~specsim.lossless.controls`: correct but unusual ones that must pass;
- :mod:`~specsim.lossless.check`, :mod:`~specsim.lossless.report`: what ``specsim
  check-lossless`` runs. See docs/losslessness.md.
"""
