"""What an engine carries into a block from earlier steps, and who may read it.

A request's blocks are not independent in an engine: it knows how many tokens are in the context,
how many steps the request has taken and how the previous one went (a KV-cache offset, a warm-up
path, a cached softmax). A verifier or scheduler that reads such state can be lossless on the
first block and lossy on the next, so the checker models it (:class:`BlockState`) and covers two
consecutive blocks (:mod:`specsim.lossless.window`).

Who reads what is declared, so the exact check can share work between states that look the same
to the pipeline:

- a scheduler of the oracle form (``scheduler(view)``) receives the state in its view; it may
  declare ``state_key(state) -> hashable``, the part of the state it reads (:func:`stateless`:
  none). Without a declaration it is assumed to read all of it (always correct, only slower).
- a registry or user :class:`~specsim.policies.base.Policy` sees a ``StepInput``, which carries no
  state: stateless by construction.
- a block rule reads state only if it declares ``state_key``; it is then called with the
  keyword ``key=state_key(state)`` (:func:`bind`) and may read nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from functools import partial


@dataclass(frozen=True)
class BlockState:
    """The engine's state of the request when a block starts.

    ``position``: tokens in its context (the prompt included). ``step``: blocks it has run
    before this one (0: its first). ``previous``: (verified length l, accepted n) of its
    previous block, None on its first. After a prefix given by the checker, the prefix is the
    request's prompt: position len(prefix), step 0, no previous block.
    """

    position: int = 0
    step: int = 0
    previous: tuple[int, int] | None = None

    def after(self, length: int, accepted: int) -> BlockState:
        """The state of the next block once this one verified ``length`` and accepted
        ``accepted`` drafts (it emitted accepted + 1 tokens)."""
        return BlockState(self.position + accepted + 1, self.step + 1, (length, accepted))


def _everything(state: BlockState) -> Hashable:
    return state


def stateless(fn: Callable) -> Callable:
    """Declare that a scheduler reads no engine state (its view's ``state`` is ignored)."""
    fn.state_key = None  # type: ignore[attr-defined]
    return fn


def scheduler_key(scheduler: Callable) -> Callable[[BlockState], Hashable] | None:
    """The part of the state a scheduler reads: None when it reads none; everything when it
    does not say (the safe assumption)."""
    return getattr(scheduler, "state_key", _everything)


def rule_key(rule: Callable) -> Callable[[BlockState], Hashable] | None:
    """The part of the state a block rule reads (None: none; rules see state only if they
    declare it)."""
    return getattr(rule, "state_key", None)


def key_of(fn: Callable[[BlockState], Hashable] | None, state: BlockState) -> Hashable:
    return None if fn is None else fn(state)


def bind(rule: Callable, key: Hashable) -> Callable:
    """The rule as a plain ``rule(p, q, x, l, u, v)`` for one value of its state key."""
    return rule if rule_key(rule) is None else partial(rule, key=key)
