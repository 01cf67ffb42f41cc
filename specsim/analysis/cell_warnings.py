"""A sweep's warnings, said once each with how many cells said it.

Why: each cell replays inside its own ``warnings.catch_warnings`` (in a worker process or in
this one), and entering one resets Python's "once per place" memory. So a warning true of every
cell printed once per cell: the CPU profile's "covers token batches up to 128; this run reached
256" came 540 times over the progress of ``specsim report schedulers-under-load``. Now a cell
records its warnings (:func:`recording`) and hands them back with its row (under ``KEY``); the
sweep tallies them (:class:`Tally`) and, once the progress is done, warns once per message, with
the count of cells. Messages that differ only in their numbers (one cell reached 256 tokens,
another 192) are one message: the first is shown and the count says how many said the like.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Iterator
from typing import Any

KEY = "_cell_warnings"  # the row's entry that carries them; never stored in the table


@contextlib.contextmanager
def recording(*ignore: type[Warning]) -> Iterator[list[tuple[type[Warning], str]]]:
    """Record the warnings of the block (except ``ignore``'s) into the yielded list, each
    distinct (category, message) once, in order; nothing is printed. The filters in force
    still apply (what Python hides by default, DeprecationWarning of a library, stays hidden)."""
    found: list[tuple[type[Warning], str]] = []
    with warnings.catch_warnings(record=True) as caught:
        for category in ignore:
            warnings.simplefilter("ignore", category)
        try:
            yield found
        finally:
            found += dict.fromkeys((w.category, str(w.message)) for w in caught)


class Tally:
    """The warnings of the cells run, grouped by message (numbers aside), in order of first."""

    def __init__(self, unit: str = "cells") -> None:
        self.unit = unit  # what a row is: a sweep's cell, or find-max-load's search
        self.cells = 0
        self._groups: dict[tuple[type[Warning], str], list[Any]] = {}

    def add(self, row: dict[str, Any]) -> None:
        """Count one finished cell and take its warnings out of ``row`` (before it is stored)."""
        self.cells += 1
        seen = set()  # a cell counts once per message, however often it said the like
        for category, message in row.pop(KEY, None) or ():
            key = (category, re.sub(r"\d[\d,.]*", "#", message))
            group = self._groups.setdefault(key, [message, 0, set()])
            group[1] += key not in seen
            group[2].add(message)
            seen.add(key)

    def lines(self) -> list[tuple[type[Warning], str]]:
        """(category, text) per message: the first such message and how many cells said it."""
        out = []
        for (category, _), (first, count, texts) in self._groups.items():
            alike = "" if len(texts) == 1 else "; the numbers vary between them"
            out.append(
                (category, f"{first} (said by {count} of {self.cells} {self.unit} run{alike})")
            )
        return out

    def warn(self) -> None:
        """Warn once per message (a category that cannot be raised becomes a UserWarning)."""
        for category, text in self.lines():
            if not (isinstance(category, type) and issubclass(category, Warning)):
                category = UserWarning
            warnings.warn(text, category, stacklevel=4)
