"""Turning a user's ``module:callable`` into a checkable pipeline, with one-line errors.

Verifier callables (see docs/losslessness.md for the full protocol):

- ``verify(p, q, x, u, v) -> (n_accepted, token)``: takes injected uniforms, so it is checked
  exactly (enumeration + integration over the uniforms) and statistically;
- ``verify(p, q, x, rng) -> (n_accepted, token)``: draws its own randomness from the numpy
  Generator ``rng``; checked statistically only;
- with ``--multi``: ``verify(p, q, xs, u, v) -> token`` (one position, k candidates).

A model callable returns a :class:`~specsim.lossless.toy.ToyLM` (or any object with ``vocab``,
``p``, ``q``, ``conf``); every law it returns is checked to be a probability vector.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import numpy as np

from specsim.errors import SpecsimError
from specsim.lossless.pipeline import Pipeline
from specsim.lossless.toy import ToyLM, validate_law
from specsim.lossless.uniforms import check_block_output, truncated
from specsim.registry import load_callable


def _positional(fn: Callable) -> list[str]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in params if p.kind in kinds]


def guarded(fn: Callable, spec: str, what: str) -> Callable:
    """Call ``fn``; any exception it raises becomes a one-line SpecsimError naming it."""

    def call(*args):
        try:
            return fn(*args)
        except SpecsimError:
            raise
        except Exception as exc:  # noqa: BLE001 - the user's code, reported in one line
            msg = str(exc).splitlines()[0] if str(exc) else ""
            raise SpecsimError(
                f"{what} {spec!r} raised {type(exc).__name__}: {msg}; see docs/losslessness.md "
                "for the callable interface"
            ) from None

    return call


def _smoke_block(rule: Callable, spec: str, rng_mode: bool) -> None:
    """One tiny call, so a wrong shape fails before any check runs."""
    p = np.array([[[0.6, 0.4, 0.0], [0.2, 0.3, 0.5]]] * 4)
    q = np.array([[[0.5, 0.25, 0.25]]] * 4)
    x = np.array([[0], [1], [2], [0]])
    if rng_mode:
        out = rule(p, q, x, 1, np.random.default_rng(0))
    else:
        out = rule(p, q, x, 1, np.full((4, 1), 0.5), np.linspace(0.1, 0.9, 4))
    if not isinstance(out, tuple | list) or len(out) != 2:
        raise SpecsimError(f"verifier {spec!r} must return a pair (n_accepted, token) of arrays")
    check_block_output(out[0], out[1], 4, 1, 3, f"verifier {spec!r}")


def verifier_pipeline(spec: str, policy: str = "full", multi: bool = False) -> Pipeline:
    """A pipeline that verifies with the user's ``module:callable``."""
    fn = load_callable(spec, "verifier")
    names = _positional(fn)
    if multi:
        if len(names) != 5:
            raise SpecsimError(
                f"multi-draft verifier {spec!r} must take (p, q, xs, u, v); it takes {names}"
            )
        return Pipeline(name=spec, multi=guarded(fn, spec, "verifier"))
    safe = guarded(fn, spec, "verifier")
    if len(names) == 5:
        pipe = Pipeline(name=f"{spec} + {policy}", rule=truncated(safe), scheduler=policy)
        _smoke_block(pipe.rule, spec, rng_mode=False)
        return pipe
    if len(names) == 4:

        def sample_rule(p, q, x, length, rng):
            return safe(p[:, : length + 1], q[:, :length], x[:, :length], rng)

        _smoke_block(sample_rule, spec, rng_mode=True)
        return Pipeline(
            name=f"{spec} + {policy}", scheduler=policy, uniforms=False, sample_rule=sample_rule
        )
    raise SpecsimError(
        f"verifier {spec!r} must take (p, q, x, u, v) or (p, q, x, rng); it takes {names}"
    )


def validated_model(spec: str) -> ToyLM:
    """The user's toy LM, its laws checked on every call (one-line error if one is not a
    probability vector). Its ``context`` (how many trailing tokens its laws read; None: all)
    is kept: a finite one lets the checks cover every state of a generation."""
    made = load_callable(spec, "model")
    toy = guarded(made, spec, "model")() if _positional(made) == [] else made
    for attr in ("vocab", "p", "q", "conf"):
        if not hasattr(toy, attr):
            raise SpecsimError(f"model {spec!r} must return a ToyLM (vocab, p, q, conf)")
    vocab = int(toy.vocab)
    context = getattr(toy, "context", None)
    if context is not None and (not isinstance(context, int) or not 0 <= context <= 8):
        raise SpecsimError(f"model {spec!r}: context must be None or an integer in 0..8")
    p, q, conf = (guarded(f, spec, "model") for f in (toy.p, toy.q, toy.conf))

    def checked_conf(prefix, k, prev):
        c = float(conf(prefix, k, prev))
        if not 0.0 <= c <= 1.0:
            raise SpecsimError(f"model {spec!r}: confidence {c} at position {k} is not in [0, 1]")
        return c

    return ToyLM(
        vocab=vocab,
        p=lambda s: validate_law(p(s), vocab, f"model {spec!r}: p{s}"),
        q=lambda s: validate_law(q(s), vocab, f"model {spec!r}: q{s}"),
        conf=checked_conf,
        name=spec,
        context=context,
    )
