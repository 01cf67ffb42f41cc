"""specsim: schedule speculative decoding under load.

Record traces of a real drafter and target, replay them in a SimPy serving simulator under any
load and prefix scheduler, and prove schedulers and verifiers lossless.
"""

__version__ = "0.1.0"
