"""Progress bars on stderr: tqdm, behind the small ``Progress`` interface specsim's loops use.

Shown when stderr is a terminal or inside a notebook (``tqdm.auto`` gives a real widget there),
or with ``SPECSIM_PROGRESS=1``; silent otherwise or with ``SPECSIM_PROGRESS=0``, so logs, CI and
tests stay clean. tqdm throttles its redraws, so hot loops may call ``update`` freely.
"""

from __future__ import annotations

import os
import sys
from typing import Any


def _in_notebook() -> bool:
    return "ipykernel" in sys.modules


def _enabled() -> bool:
    flag = os.environ.get("SPECSIM_PROGRESS")
    if flag is not None:
        return flag not in ("0", "", "false", "no")
    return sys.stderr.isatty() or _in_notebook()


class Progress:
    """``with Progress(total, "replay", unit=" tok") as bar: bar.update(n)``.

    ``total`` 0 or None: no known end (a counter with a rate, no ETA).
    """

    def __init__(self, total: float, desc: str = "", unit: str = "", enabled: bool | None = None):
        self.total = float(total) if total else 0.0
        self.desc = desc
        self.unit = unit
        self.n = 0.0
        self.enabled = _enabled() if enabled is None else enabled
        self._bar: Any = None
        if self.enabled:
            if _in_notebook():
                from tqdm.auto import tqdm
            else:
                from tqdm import tqdm
            self._bar = tqdm(
                total=self.total or None,
                desc=desc,
                unit=unit.strip() or "it",
                unit_scale=True,
                file=sys.stderr,
                dynamic_ncols=True,
                leave=True,
            )

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: float = 1.0) -> None:
        self.n += n
        if self._bar is not None:
            self._bar.update(n)

    def set(self, n: float) -> None:
        self.update(n - self.n)

    def note(self, text: str) -> None:
        """A short status after the bar (e.g. ``"12 cached"``)."""
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self.enabled = False
