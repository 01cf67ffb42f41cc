"""A speculative pipeline as the checks see it: drafter, scheduler, block rule.

One object names everything that can break losslessness, so the catalogue of mutants, the
correct references and a user's own code are all checked by the same functions
(:mod:`specsim.lossless.check`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from specsim.lossless.oracle import Drafter, Scheduler, same_law
from specsim.lossless.uniforms import BlockRule, truncated
from specsim.lossless.verifiers import rejection


@dataclass(frozen=True, eq=False)
class Pipeline:
    """How one request's blocks are drafted, scheduled and verified.

    ``rule``: the block rule (default: reference rejection sampling truncated at l).
    ``scheduler``: a registry name/Policy or an oracle :data:`Scheduler`.
    ``drafter(q) -> law``: the law drafts are really drawn from (correct: q itself).
    ``greedy``: compare with the argmax chain (temperature 0) instead of the product of p's.
    ``extra(p, q, x) -> (u_thr, v_thr)``: the rule's own thresholds for exact integration.
    ``multi``: a multi-draft verifier (then ``rule``/``scheduler`` are unused);
    ``without_replacement``: its candidates are drawn without replacement.
    ``uniforms``: False when the verifier draws its own randomness (statistical checks only).
    ``sample_rule``: the rule the statistical sampler drives, when it differs (a user's
    verifier that takes ``rng`` instead of uniforms).
    """

    name: str
    rule: BlockRule = field(default_factory=lambda: truncated(rejection))
    scheduler: Scheduler | str = "full"
    drafter: Drafter = same_law
    greedy: bool = False
    extra: Callable | None = None
    multi: Callable | None = None
    without_replacement: bool = False
    uniforms: bool = True
    sample_rule: Callable | None = None
    doc: str = ""
