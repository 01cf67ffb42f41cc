"""The losslessness suite: prove verifiers and prefix schedulers keep the target's law.

- :mod:`~specsim.lossless.toy`: tiny table LMs (target p, draft q, Markov confidence head);
  :mod:`~specsim.lossless.worlds`: the worlds checked in and the prefixes checked after;
- :mod:`~specsim.lossless.verifiers`: reference verifiers driven by explicit uniforms;
- :mod:`~specsim.lossless.uniforms`: exact integration of a verifier over its uniforms (every
  breakpoint found by scanning and bisection, or a loud refusal);
- :mod:`~specsim.lossless.state`: the engine state a block starts in, and who reads it;
- :mod:`~specsim.lossless.blocks`: the exact law of one block at a state (kernels, shared);
  :mod:`~specsim.lossless.window`: the laws the exact check proves (two whole blocks after
  prefixes, one block at every state a generation reaches);
- :mod:`~specsim.lossless.oracle`: schedulers, batches and the law of the first m tokens;
- :mod:`~specsim.lossless.sampling` and :mod:`~specsim.lossless.stats`: sampled generations,
  the stratified sequential G-test (family-wise false-alarm rate <= 1e-6 per run);
- :mod:`~specsim.lossless.mutants`: the catalogue of broken implementations;
  :mod:`~specsim.lossless.controls`: correct but unusual ones that must pass;
- :mod:`~specsim.lossless.check`, :mod:`~specsim.lossless.verdicts`,
  :mod:`~specsim.lossless.report`: what ``specsim check-lossless`` runs and says;
  :mod:`~specsim.lossless.api`: the same as notebook calls (``specsim.check_lossless``).
  See docs/losslessness.md.
"""
