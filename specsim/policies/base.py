"""What a prefix scheduler receives and returns, and the registry that finds one by name.

A policy is a pure function of one scheduling decision: given the draft confidences of the R
running requests and the cost of a target step, return how many leading draft tokens each
request verifies. The simulator, the losslessness oracle and the real engine all call the SAME
function, so what is proven lossless is what is simulated.

Protocol (``Policy.schedule(inp) -> lengths``):
- ``inp.conf``: (R, gamma) conditional confidences c_{r,k} of the current drafts.
- ``inp.step_time(B)``: seconds of one target step over a token batch B (vectorised over B).
  SPS(B) = 1 / step_time(B).
- ``inp.lagged_conf``: (R, gamma) confidences known when the scheduler had to run ahead (two
  steps earlier under ZOS; a request too new to have them gets its current row). Only ``zos``
  style policies use it.
- ``inp.accept_rate``: (gamma,) online estimate of conditional acceptance per position
  (``goodput``).
- ``inp.accept_len``: (R,) the truth: only ``oracle`` may read it; it is an upper bound, not a
  scheduler.
- ``inp.rng``: the policy's own seeded ``numpy.random.Generator`` (may be None): a random policy
  draws from it and nothing else.
- ``inp.accept_hist``: (C, gamma, bins, 2) float64 counts of drafts REACHED (all earlier ones
  accepted) and ACCEPTED in earlier steps, by request class, position and confidence bin
  (``bins`` equal bins of [0, 1]); ``inp.request_class``: (R,) each request's class. Outcomes
  of steps that ended before the decision only (under ZOS, not the step it overlaps).
- ``inp.survival`` / ``inp.lagged_survival``: (R, gamma) float64 survivals
  ``cumprod(conf.astype(float64), axis=1)`` of ``conf`` / ``lagged_conf``, equal bit for bit to
  computing them; the engine gathers them from a table it computes once per trace (speed only,
  issue #13). May be None: a policy that reads them computes them itself then.
Returns an integer array of shape (R,) with values in [0, gamma].

Non-anticipation (what makes truncation lossless): whether draft token k of request r is verified
may depend on c_{r,1..k} and on other requests, never on c_{r,k+1..} (which depend on the token
x_{r,k} itself through the Markov feature). See docs/ and the losslessness suite.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from specsim.errors import SpecsimError
from specsim.registry import Registry

StepTime = Callable[[np.ndarray], np.ndarray]
# (conf (m, gamma), accept_len (m,), step_time) -> (m,) lengths of a lone request per row
SoloSchedule = Callable[[np.ndarray, np.ndarray, StepTime], np.ndarray]


class TableStepTime:
    """A ``step_time`` backed by a dense table of seconds at every B = 0..len-1, shifted by
    ``shift`` tokens (prefill sharing the step): ``f(B) = table[B + shift]``, and ``fn`` (the
    profile's own function of the shifted batch) beyond the table.

    A policy may read a run of consecutive batch sizes as a slice, ``window(start, n)`` (the
    same numbers ``f`` returns, without building the batch array): the engine passes one for
    1-D profiles (speed only, issue #13). Everything else just calls it.
    """

    __slots__ = ("fn", "table", "shift", "offset")

    def __init__(self, fn: StepTime, table: np.ndarray, shift: int = 0, offset: float = 0.0):
        self.fn, self.table, self.shift, self.offset = fn, table, shift, offset

    def __call__(self, batch):
        out = self.fn(np.asarray(batch) + self.shift) if self.shift else self.fn(batch)
        return out + self.offset if self.offset else out

    def window(self, start: int, n: int) -> np.ndarray | None:
        """Step seconds at B = start..start+n-1 as a view of the table (plus ``offset``, the
        seconds every step of this one pays whatever its batch: its KV read), or None
        beyond it."""
        a = start + self.shift
        if a < 0 or a + n > self.table.shape[0]:
            return None
        w = self.table[a : a + n]
        return w + self.offset if self.offset else w


@dataclass(frozen=True, eq=False)
class StepInput:
    """Everything a policy may look at for one scheduling decision."""

    conf: np.ndarray
    step_time: StepTime
    lagged_conf: np.ndarray | None = None
    accept_rate: np.ndarray | None = None
    accept_len: np.ndarray | None = None
    # The policy's own seeded random stream: a random policy must draw from it (and only it), so
    # the losslessness checker can integrate over its randomness. None: the caller gives none.
    rng: np.random.Generator | None = None
    # Precomputed survivals of conf / lagged_conf (speed only; None: compute from conf).
    survival: np.ndarray | None = None
    lagged_survival: np.ndarray | None = None
    # Verification outcomes of earlier steps, by class, position and confidence bin.
    accept_hist: np.ndarray | None = None
    request_class: np.ndarray | None = None
    # Which rows of the lagged confidences are real (a request too new to have one has its
    # current row there), and ``draft_time(k)``: the seconds drafting k tokens for every request
    # costs this step (None: the engine charges no drafting). Always given to ``plan``; given to
    # ``schedule`` when the policy ``needs`` "lag_known" / "draft_time".
    lag_known: np.ndarray | None = None
    draft_time: Callable[[int], float] | None = None
    # How many draft tokens each request has this step when the plan asked for fewer than the
    # block (None: the whole block): the engine verifies at most that many.
    drafted: int | None = None

    @property
    def n_requests(self) -> int:
        return int(self.conf.shape[0])

    @property
    def gamma(self) -> int:
        return int(self.conf.shape[1])


_new_object = object.__new__
_STEP_INPUT_FIELDS = frozenset(f.name for f in fields(StepInput))
_STEP_INPUT_DEFAULTS = {
    f.name: f.default for f in fields(StepInput) if f.name not in ("conf", "step_time")
}


def step_input(**fields: Any) -> StepInput:
    """``StepInput(**fields)`` for the engine's hot loop: the same object, built without the
    frozen dataclass's one ``object.__setattr__`` per field (2.6 us a step at 64 requests, a
    tenth of the engine's own per-step cost; issue #33). Fields left out get their defaults;
    unknown names are refused as ``__init__`` would."""
    if not fields.keys() <= _STEP_INPUT_FIELDS:  # (a comparison builds no set)
        unknown = fields.keys() - _STEP_INPUT_FIELDS
        raise TypeError(f"StepInput has no field {sorted(unknown)[0]!r}")
    inp = _new_object(StepInput)
    d = inp.__dict__
    d.update(_STEP_INPUT_DEFAULTS)
    d.update(fields)
    return inp


@dataclass(frozen=True, eq=False)
class Policy:
    """A named prefix scheduler.

    ``zos``: the engine runs it ahead, overlapped with the previous target step (zero-overhead
    scheduling); its compute time then costs nothing unless it exceeds the step.
    ``lossless``: what the policy claims; the losslessness suite checks the claim.
    ``needs``: which optional StepInput fields it reads (the engine fills only those).
    ``solo``: optional, for speed only: ``solo(conf (m, gamma), accept_len (m,), step_time) ->
    (m,)`` gives, for each of m confidence rows, what ``schedule`` returns for ONE running
    request with that row (and no prefill in the step). With one request in flight the engine
    asks for every row the request may visit at once and walks them without an event per step
    (issue #13). ``solo_lagged``: the decision is a function of the request's LAGGED row
    (``zos``), so the engine passes lagged rows. It may raise ValueError when it does not
    apply to these rows; the engine then schedules step by step. The policy tests check that
    it agrees with ``schedule``. ``rowwise``: ``solo`` holds at ANY batch size (a request's
    length reads its own row only: static lengths, thresholds, the oracle), so the engine
    walks several requests the same way.

    What the drafter must produce, decided BEFORE it runs (the engine charges drafting by what
    is drafted, serving model v2): ``draft_len`` a constant number of draft tokens per request
    (``ar`` 0: no drafter at all; ``mtp1`` 1: a one-token drafter; ``static:K`` K); None, the
    whole block. ``plan(inp) -> int | None``: the same from what is known before the draft
    (``inp.conf`` holds the LAGGED rows, ``inp.lag_known`` which requests have one, the
    history, the step cost): 0 skips the drafter for the whole step (as vLLM and SGLang switch
    speculation off under load), k drafts k tokens, None the block; ``schedule`` must then
    verify no more than it. ``decides``: False for policies whose lengths are constants (no
    scheduler time is charged for them). ``solo_rows``: ``solo`` also takes a step time that
    returns one row of seconds per confidence row (shape (m, len(B)): a lone request's steps
    read a KV that grows along its rows, serving model v2).
    """

    name: str
    schedule: Callable[[StepInput], np.ndarray]
    zos: bool = False
    lossless: bool = True
    needs: frozenset[str] = field(default_factory=frozenset)
    doc: str = ""
    solo: SoloSchedule | None = None
    solo_lagged: bool = False
    rowwise: bool = False
    draft_len: int | None = None
    plan: Callable[[StepInput], int | None] | None = None
    decides: bool = True
    solo_rows: bool = False

    def __call__(self, inp: StepInput) -> np.ndarray:
        return self.schedule(inp)


POLICIES: Registry[Policy] = Registry("policy")


def _guarded(
    fn: Callable, spec: str, what: str = "policy", passthrough: tuple[type, ...] = ()
) -> Callable:
    """A plug-in's callable (``schedule``, ``solo``, ``plan``) whose failures become one line
    naming the policy.

    A user's policy is code specsim did not write: when it raises, the user needs to know it was
    the policy (and what it raised), not read a traceback through the engine; when it calls
    ``sys.exit``, the run must not end with a bare exit code and no word. Errors that are
    already one-liners, and Ctrl-C, pass through unchanged.
    """

    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            out = fn(*args, **kwargs)
            if inspect.iscoroutine(out):  # an ``async def`` hook: nothing awaits it here
                out.close()  # (closed, so Python does not warn that it was never awaited)
                raise SpecsimError(
                    f"{what} {spec!r} is an async function (it returned a coroutine); write it "
                    "as a plain def: the engine calls it synchronously at every step"
                )
            return out
        except (SpecsimError, *passthrough):
            raise
        except SystemExit as exc:
            raise SpecsimError(
                f"{what} {spec!r} called sys.exit({exc.code!r}) while running; a policy returns "
                "lengths, it must not exit"
            ) from None
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - anything a plug-in raises (GeneratorExit too)
            raise SpecsimError(
                f"{what} {spec!r} raised {type(exc).__name__}: {str(exc)[:200]}; fix the policy "
                "(it gets a StepInput and returns one integer length per request)"
            ) from exc

    guarded.__name__ = getattr(fn, "__name__", "schedule")
    guarded.__qualname__ = f"plugin[{spec}]"
    return guarded


def _wrap_user(obj: object, spec: str) -> Policy:
    """A user's ``module:callable`` may be a Policy, a factory returning one, or a bare
    ``schedule(StepInput) -> lengths`` function. Every callable it hands the engine (schedule,
    the solo walk, the step planner) is guarded (``_guarded``)."""
    policy = _wrap_user_unguarded(obj, spec)
    _check_user_fields(policy, spec)
    return replace(
        policy,
        schedule=_guarded(policy.schedule, spec),
        solo=None if policy.solo is None else _checked_solo(policy.solo, spec),
        plan=None if policy.plan is None else _checked_plan(policy.plan, spec),
    )


# What a plug-in may list in ``Policy.needs``: the optional StepInput fields the engine fills.
KNOWN_NEEDS = _STEP_INPUT_FIELDS - {"conf", "step_time"}


def _check_user_fields(policy: Policy, spec: str) -> None:
    """A plug-in's Policy fields, checked once when it is loaded: the engine reads them at every
    step (``needs`` as a set of names, ``draft_len`` as an index), so a wrong type there would
    surface as an internal error deep in a run, or not at all (``draft_len=2.5``)."""
    where = f"policy {spec!r}"
    needs = policy.needs
    if not isinstance(needs, set | frozenset) or not all(isinstance(x, str) for x in needs):
        raise SpecsimError(
            f"{where}: needs must be a frozenset of StepInput field names, got "
            f"{type(needs).__name__}; e.g. needs=frozenset({{'survival'}})"
        )
    unknown = sorted(needs - KNOWN_NEEDS)
    if unknown:
        raise SpecsimError(
            f"{where}: needs names {unknown[0]!r}, which is not a StepInput field; valid: "
            f"{', '.join(sorted(KNOWN_NEEDS))}"
        )
    k = policy.draft_len
    if k is not None and (isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 0):
        raise SpecsimError(
            f"{where}: draft_len must be None (the whole block) or a whole number of draft "
            f"tokens >= 0, got {k!r}"
        )
    for name in ("zos", "lossless", "solo_lagged", "rowwise", "decides", "solo_rows"):
        if not isinstance(getattr(policy, name), bool | np.bool_):
            raise SpecsimError(
                f"{where}: {name} must be True or False, got {getattr(policy, name)!r}"
            )
    for name in ("schedule", "solo", "plan"):
        fn = getattr(policy, name)
        if (fn is not None or name == "schedule") and not callable(fn):
            raise SpecsimError(f"{where}: {name} must be a function, got {type(fn).__name__}")


def _checked_solo(fn: SoloSchedule, spec: str) -> SoloSchedule:
    """A plug-in's ``solo``, guarded, and what it returns put through the check every
    ``schedule`` answer goes through (:func:`check_lengths`): one length in [0, gamma] per
    confidence row, or a one-line error naming the plug-in and the hook. The solo walk trusts
    these lengths for hundreds of steps at once, so a bad one must not get in."""
    # ValueError is solo's documented "not for these rows": the engine then schedules step by
    # step, for a plug-in as for a built-in
    guarded = _guarded(fn, spec, "policy (solo)", passthrough=(ValueError,))

    def solo(conf: np.ndarray, accept_len: np.ndarray, step_time: StepTime) -> np.ndarray:
        out = guarded(conf, accept_len, step_time)
        n, gamma = int(conf.shape[0]), int(conf.shape[1])
        if lengths_ok(out, n, gamma):
            return out
        shape = step_input(conf=conf, step_time=step_time)
        return check_lengths(out, shape, spec, what="policy (solo)")

    solo.__qualname__ = f"plugin[{spec}].solo"
    return solo


def _checked_plan(fn: Callable[[StepInput], int | None], spec: str) -> Callable:
    """A plug-in's ``plan``, guarded, its answer checked by :func:`check_plan` (the engine
    would otherwise clamp a negative or an over-long plan, or truncate 2.5, in silence)."""
    guarded = _guarded(fn, spec, "policy (plan)")

    def plan(inp: StepInput) -> int | None:
        return check_plan(guarded(inp), inp, spec)

    plan.__qualname__ = f"plugin[{spec}].plan"
    return plan


def check_plan(k: object, inp: StepInput, name: str, what: str = "policy (plan)") -> int | None:
    """What a ``plan`` may return: None (the whole block) or a whole number of draft tokens in
    [0, gamma] (a Python or numpy integer, an integral float, ``Fraction(3)``); anything else
    (a negative, more than gamma, NaN, 2.5, a bool, text, an array) is a one-line error."""
    if k is None:
        return None
    gamma = inp.gamma
    if type(k) is int and 0 <= k <= gamma:  # the common answer, checked at every step
        return k
    fix = f"return None (the whole block) or a whole number of draft tokens in [0, {gamma}]"
    if isinstance(k, np.ma.MaskedArray) and np.ma.count_masked(k):  # np.ma.masked too
        raise SpecsimError(f"{what} {name!r} returned a masked value; {fix}")
    if isinstance(k, np.ndarray) and k.ndim == 0:
        k = k.item()
    if isinstance(k, bool | np.bool_) or not _real(k):
        shown = f"an array of shape {k.shape}" if isinstance(k, np.ndarray) else type(k).__name__
        raise SpecsimError(f"{what} {name!r} returned {shown} ({str(k)[:40]!r}); {fix}")
    value = _integral(k, name, what)
    if not 0 <= value <= gamma:
        raise SpecsimError(f"{what} {name!r} returned {value}, outside [0, {gamma}]; {fix}")
    return value


def _real(x: object) -> bool:
    import numbers
    from decimal import Decimal

    return isinstance(x, numbers.Real | np.number | Decimal)


def _wrap_user_unguarded(obj: object, spec: str) -> Policy:
    if isinstance(obj, Policy):
        return obj
    if callable(obj):
        try:
            import inspect

            params = [
                p
                for p in inspect.signature(obj).parameters.values()
                if p.default is inspect.Parameter.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            ]
        except Exception:  # noqa: BLE001 - a __signature__ that raises: treat as one-argument
            params = [None]
        if not params:  # a zero-argument factory
            try:
                made = obj()
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # noqa: BLE001 - a plug-in's own failure
                raise SpecsimError(
                    f"policy factory {spec!r} raised {type(exc).__name__}: {str(exc)[:200]}"
                ) from exc
            if isinstance(made, Policy):
                return made
            if callable(made):
                return Policy(name=spec, schedule=made)
            raise SpecsimError(
                f"policy factory {spec!r} returned {type(made).__name__}, not a Policy"
            )
        if len(params) == 1:
            return Policy(name=spec, schedule=obj)  # type: ignore[arg-type]
    raise SpecsimError(
        f"policy {spec!r} must be a Policy, a zero-argument factory, or a function "
        "schedule(inp: StepInput) -> lengths"
    )


def get_policy(spec: str | Policy) -> Policy:
    """``"hw-aware"``, ``"static:3"``, ``"threshold:0.6"`` or ``"my.module:my_policy"``."""
    if isinstance(spec, Policy):
        return spec
    import specsim.policies  # noqa: F401  (registers the built-in policies)

    return POLICIES.get(spec, wrap=_wrap_user)


def check_lengths(lengths: object, inp: StepInput, name: str, what: str = "policy") -> np.ndarray:
    """The one validation boundary for what a policy returns: any sequence of real integers in
    [0, gamma], one per request, becomes an int64 array; anything else is a one-line error.

    Accepted: integer arrays and lists, integral floats, and objects that are integers in value
    (Python big ints, ``Fraction(3)``, ``Decimal('3')``). Refused, naming what came back: other
    shapes, strings, booleans, complex numbers, NaN, fractions of a token, masked entries.
    ``what`` names the hook in the message (``"policy (solo)"``).
    """
    n, gamma = inp.n_requests, inp.gamma
    if isinstance(lengths, np.ma.MaskedArray):
        if np.ma.count_masked(lengths):
            raise SpecsimError(
                f"{what} {name!r} returned a masked array with masked entries; return plain "
                "integers, one per request"
            )
        lengths = lengths.filled()
    try:
        arr = np.asarray(lengths)
    except Exception as exc:  # noqa: BLE001 - whatever a plug-in returned
        raise SpecsimError(
            f"{what} {name!r} returned {type(lengths).__name__}, which is not an array of "
            f"lengths ({type(exc).__name__}); return one integer per request"
        ) from None
    if arr.shape != (n,):
        raise SpecsimError(
            f"{what} {name!r} returned shape {arr.shape}, expected ({n},): one "
            "verification length per request"
        )
    kind = arr.dtype.kind
    if kind == "f" and (not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr))):
        raise SpecsimError(f"{what} {name!r} returned non-integer lengths; return integers")
    if kind == "O":  # Python ints of any size, Fraction, Decimal: compared exactly, in Python
        values = [_integral(x, name, what) for x in arr.tolist()]
    elif kind in "iuf":
        values = arr
    else:  # b (bool), c (complex), U/S (text), M/m (dates), V (records)
        raise SpecsimError(
            f"{what} {name!r} returned {arr.dtype} values; return integers in [0, {gamma}]"
        )
    if n and (min(values) < 0 or max(values) > gamma):
        raise SpecsimError(
            f"{what} {name!r} returned lengths outside [0, {gamma}] (min {min(values)}, "
            f"max {max(values)})"
        )
    return np.asarray(values).astype(np.int64)


def _integral(x: object, name: str, what: str = "policy") -> int:
    """One element of an object array: an integer in value, or a one-line error."""
    import numbers

    if isinstance(x, bool) or not isinstance(x, numbers.Real | np.number):
        from decimal import Decimal

        if not isinstance(x, Decimal):
            raise SpecsimError(
                f"{what} {name!r} returned a {type(x).__name__} ({str(x)[:40]!r}) as a length; "
                "return integers"
            )
    try:
        if isinstance(x, numbers.Integral):
            return int(x)
        as_int = int(x)  # type: ignore[call-overload]
        if as_int == x:
            return as_int
    except (TypeError, ValueError, OverflowError, ArithmeticError):
        pass
    raise SpecsimError(f"{what} {name!r} returned {str(x)[:40]!r}, not a whole number of tokens")


_U64 = np.dtype(np.uint64)


def lengths_ok(lengths: object, n: int, gamma: int) -> bool:
    """The engine's per-step check, cheap enough for every step of every policy: an integer
    array of shape (n,) with values in [0, gamma] (one unsigned comparison catches negatives).
    A plain ndarray only: a subclass (a masked array, a matrix) overrides the reductions this
    check relies on, so it takes :func:`check_lengths`' slow path, which converts or refuses it."""
    if not (type(lengths) is np.ndarray and lengths.shape == (n,)):
        return False
    if lengths.dtype == np.int64:  # the common case: one unsigned max, no copy
        if n == 0:
            return True
        u = lengths.view(_U64)
        return int(u[u.argmax()]) <= gamma  # (argmax: a fraction of a ufunc reduce's cost)
    return lengths.dtype.kind == "i" and (n == 0 or (lengths.min() >= 0 and lengths.max() <= gamma))


def checked_lengths(lengths: object, inp: StepInput, name: str) -> np.ndarray:
    """``lengths`` if they pass :func:`lengths_ok`, else :func:`check_lengths`' verdict (which
    converts integral floats and refuses the rest in one line). Built-in and plug-in policies
    alike: an engine trusts no policy by where its code lives."""
    n, gamma = inp.conf.shape
    if lengths_ok(lengths, n, gamma):
        return lengths  # type: ignore[return-value]
    return check_lengths(lengths, inp, name)
