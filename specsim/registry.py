"""A small string-keyed registry: policies and cost profiles are found by name.

Why a registry and not an if/elif chain: one edit adds a policy, a typo lists the valid names,
and a user can plug in their own object from ``module:callable`` without touching specsim.
Duplicate names are refused (Vidur's registry silently ignored them).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from specsim.errors import SpecsimError

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to factories ``factory(arg: str | None) -> T``.

    A spec is ``NAME``, ``NAME:ARG`` (the factory receives ``ARG`` as a string) or
    ``module.path:callable`` for a user's own factory/object (resolved by :meth:`get`).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._factories: dict[str, Callable[[str | None], T]] = {}
        self._help: dict[str, str] = {}

    def register(
        self, name: str, help: str = ""
    ) -> Callable[[Callable[[str | None], T]], Callable[[str | None], T]]:
        """Decorator: ``@POLICIES.register("hw-aware", help="...")`` over a factory."""

        def deco(factory: Callable[[str | None], T]) -> Callable[[str | None], T]:
            if name in self._factories:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._factories[name] = factory
            self._help[name] = help or (factory.__doc__ or "").strip().split("\n")[0]
            return factory

        return deco

    def no_arg(self, name: str, arg: str | None) -> None:
        """Refuse ``NAME:ARG`` for a factory that takes no argument."""
        if arg is not None:
            raise SpecsimError(f"{self.kind} {name!r} takes no argument (got {name}:{arg})")

    def names(self) -> list[str]:
        return sorted(self._factories)

    def help(self, name: str) -> str:
        return self._help[name]

    def __contains__(self, name: str) -> bool:
        return name in self._factories

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def split(self, spec: str) -> tuple[str, str | None]:
        """``"threshold:0.5"`` -> ``("threshold", "0.5")``; ``"full"`` -> ``("full", None)``."""
        name, sep, arg = spec.partition(":")
        return name, (arg if sep else None)

    def get(self, spec: str, wrap: Callable[[object, str], T] | None = None) -> T:
        """Build the object a spec names.

        ``wrap(obj, spec)`` turns whatever a user's ``module:callable`` resolves to into a ``T``
        (and raises :class:`SpecsimError` when it cannot).
        """
        spec = spec.strip()
        name, arg = self.split(spec)
        if name in self._factories:
            return self._factories[name](arg)
        if arg is not None and ("." in name or _importable(name)):
            obj = load_callable(spec, self.kind)
            if wrap is None:
                return obj  # type: ignore[return-value]
            return wrap(obj, spec)
        close = difflib.get_close_matches(name, self.names(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        if arg is not None and not close:
            raise SpecsimError(
                f"{self.kind} {spec!r}: no {self.kind} named {name!r} and cannot import module "
                f"{name!r}; valid names: {', '.join(self.names())}, or module:callable"
            )
        raise SpecsimError(
            f"unknown {self.kind} {spec!r}{hint}; valid names: {', '.join(self.names())}, "
            f"or module:callable for your own"
        )


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _cwd_on_path(mod_name: str) -> None:
    """A module in the current folder imports as ``python -m`` would find it: a console script
    does not put the folder on ``sys.path``, so ``--verifier mymod:fn`` beside ``mymod.py``
    failed without ``PYTHONPATH=.``. Only when the module is not importable otherwise and the
    folder holds it (``mymod.py`` or ``mymod/__init__.py``), so nothing installed is shadowed."""
    import os
    import sys
    from pathlib import Path

    top = mod_name.split(".")[0]
    here = os.getcwd()
    if not top.isidentifier() or here in sys.path or _importable(top):
        return
    if Path(here, f"{top}.py").is_file() or Path(here, top, "__init__.py").is_file():
        sys.path.insert(0, here)
        importlib.invalidate_caches()


def load_callable(spec: str, kind: str = "callable") -> object:
    """Import ``module.path:attr`` and return the attribute, with one-line errors."""
    mod_name, sep, attr = spec.partition(":")
    if not sep or not mod_name or not attr:
        raise SpecsimError(f"{kind} {spec!r} is not of the form module:callable")
    _cwd_on_path(mod_name)
    try:
        mod = importlib.import_module(mod_name)
    except SystemExit as exc:
        raise SpecsimError(
            f"module {mod_name!r} (for {kind} {spec!r}) called sys.exit({exc.code!r}) when "
            "imported; a plug-in module must only define things"
        ) from None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - any import failure is the user's
        hint = "check the module is on PYTHONPATH" if isinstance(exc, ImportError) else "fix it"
        raise SpecsimError(
            f"cannot import module {mod_name!r} for {kind} {spec!r}: {type(exc).__name__}: "
            f"{str(exc)[:200]}; {hint}"
        ) from None
    obj = mod
    for part in attr.split("."):
        try:  # a module's own __getattr__ may raise anything
            obj = getattr(obj, part)
        except AttributeError:
            raise SpecsimError(
                f"module {mod_name!r} has no attribute {attr!r} (for {kind} {spec!r})"
            ) from None
        except Exception as exc:  # noqa: BLE001
            raise SpecsimError(
                f"looking up {attr!r} in module {mod_name!r} (for {kind} {spec!r}) raised "
                f"{type(exc).__name__}: {str(exc)[:200]}; fix the module"
            ) from None
    if not callable(obj):
        raise SpecsimError(f"{kind} {spec!r} is not callable")
    return obj
