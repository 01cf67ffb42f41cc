"""Config dataclasses that are also command-line flags: each default and help text written once.

A frozen dataclass field declared with :func:`option` carries its flag's help (and, where the
default does not say it, its type, choices or nargs). :func:`add_options` turns the fields into
``argparse`` flags (``max_running`` -> ``--max-running``, defaults from the dataclass) and
:func:`from_args` builds the dataclass back from the parsed namespace, so a command, a notebook
call and the ``config.json`` saved beside a result all read the same defaults (Vidur's pattern).
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, Field, field, fields
from typing import Any


def option(
    default: Any = None,
    help: str = "",  # noqa: A002 - argparse's own name
    *,
    flag: str | None = None,
    type: Any = None,  # noqa: A002
    choices: tuple | None = None,
    nargs: str | None = None,
    metavar: str | None = None,
    required: bool = False,
    cli: bool = True,
    sequence: bool = False,
) -> Any:
    """A dataclass field that is also a flag (``cli=False``: a field the CLI does not offer;
    ``sequence``: a tuple field whose default is None, given as comma-separated ``type``)."""
    meta = {
        "help": help,
        "flag": flag,
        "type": type,
        "choices": choices,
        "nargs": nargs,
        "metavar": metavar,
        "required": required,
        "cli": cli,
        "sequence": sequence,
    }
    if isinstance(default, (list, dict, set)):
        raise TypeError("use a tuple (frozen) for a sequence default")
    return field(default=default, metadata=meta)


def _flag(f: Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def help_text(cls: type, name: str) -> str:
    """A field's help with its default appended (when the text does not already say it)."""
    f = next(x for x in fields(cls) if x.name == name)
    text = f.metadata.get("help", "").replace("%", "%%")
    d = f.default
    if d is not MISSING and d is not None and not isinstance(d, bool) and "default" not in text:
        shown = ",".join(map(str, d)) if isinstance(d, tuple) else d
        text += f" (default: {shown})"
    return text


def default_of(cls: type, name: str) -> Any:
    return next(x for x in fields(cls) if x.name == name).default


def add_options(
    p: argparse.ArgumentParser | Any,
    cls: type,
    only: tuple[str, ...] | None = None,
    skip: tuple[str, ...] = (),
) -> None:
    """Add a flag for every CLI field of ``cls`` (or those in ``only``), in declaration order.

    bool fields become ``--x`` (default False) or ``--x/--no-x`` (default True); tuple fields
    take comma-separated values unless the field gives ``nargs``; other types come from the
    default (or the field's ``type``)."""
    for f in fields(cls):
        m = f.metadata
        if not m.get("cli", False) or f.name in skip or (only is not None and f.name not in only):
            continue
        kw: dict[str, Any] = {"dest": f.name, "help": help_text(cls, f.name)}
        d = f.default
        if m.get("required"):
            kw["required"] = True
        else:
            kw["default"] = d
        if isinstance(d, bool):  # --x for a False default, --x/--no-x for a True one
            kw["action"] = argparse.BooleanOptionalAction if d else "store_true"
        elif _is_list(f):  # parsed by from_args, so a bad item is a one-line SpecsimError
            kw["type"] = str
            kw["metavar"] = m.get("metavar") or "A,B,..."
        elif m.get("nargs"):
            kw["type"] = m.get("type") or str
            kw["nargs"] = m["nargs"]
        else:
            kw["type"] = m.get("type") or (type(d) if d is not None else str)
            for k in ("choices", "nargs", "metavar"):
                if m.get(k) is not None:
                    kw[k] = m[k]
        p.add_argument(_flag(f), **kw)


def _is_list(f: Field) -> bool:
    return (
        isinstance(f.default, tuple) or bool(f.metadata.get("sequence"))
    ) and not f.metadata.get("nargs")


def split_items(value: str, what: str) -> list[str]:
    """A comma-separated list's items, stripped. Every list flag reads through here, so one rule
    holds everywhere: an empty item ("4,,8", "4,", ",4" or "") is refused, since it is a typo
    whose silent drop would search another grid than the user wrote."""
    items = [x.strip() for x in str(value).split(",")]
    if "" in items:
        from specsim.errors import SpecsimError

        what_empty = "is empty" if items == [""] else f"has an empty item in {value!r}"
        raise SpecsimError(f"{what} {what_empty}; give comma-separated values, e.g. 1,2,4")
    return items


def _parse_list(f: Field, value: Any) -> Any:
    """A comma-separated flag value as the field's tuple (defaults pass through)."""
    if not isinstance(value, str):
        return value
    d = f.default
    elem = f.metadata.get("type") or (type(d[0]) if isinstance(d, tuple) and d else str)
    items = split_items(value, _flag(f))
    try:
        return tuple(elem(x) for x in items)
    except ValueError:
        from specsim.errors import SpecsimError

        raise SpecsimError(
            f"{_flag(f)} takes comma-separated {elem.__name__} values, got {value!r}"
        ) from None


def from_args(cls: type, args: argparse.Namespace, **extra: Any) -> Any:
    """The dataclass from a parsed namespace (its fields that the namespace has) plus ``extra``."""
    kw: dict[str, Any] = {}
    for f in fields(cls):
        if not hasattr(args, f.name):
            continue
        v = getattr(args, f.name)
        kw[f.name] = _parse_list(f, v) if _is_list(f) else tuple(v) if isinstance(v, list) else v
    kw.update(extra)
    return cls(**kw)
