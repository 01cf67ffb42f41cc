"""The losslessness suite: prove verifiers and prefix schedulers keep the target's law.

- :mod:`~specsim.lossless.toy`: tiny table LMs (target p, draft q, Markov confidence head);
- :mod:`~specsim.lossless.verifiers`: reference verifiers driven by explicit uniforms;
- :mod:`~specsim.lossless.uniforms`: exact integration of a verifier over its uniforms;
- :mod:`~specsim.lossless.oracle`: the exact law of a request's output under a scheduler;
- :mod:`~specsim.lossless.sampling` and :mod:`~specsim.lossless.stats`: sampled checks, G-test;
- :mod:`~specsim.lossless.mutants`: the catalogue of broken implementations;
- :mod:`~specsim.lossless.check`, :mod:`~specsim.lossless.report`: what ``specsim
  check-lossless`` runs. See docs/losslessness.md.
"""
