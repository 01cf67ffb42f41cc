"""Progress on stderr, behind the small ``Progress`` interface specsim's loops use.

Three modes, so that an 18-minute sweep is never silent and a 2-second one never clutters a log:

- a tqdm bar when stderr is a terminal or inside a notebook (``tqdm.auto``: a real widget), or
  with ``SPECSIM_PROGRESS=1``;
- periodic plain lines when stderr is a file or a pipe (a log, ``nohup``, CI): the first after
  ``SPECSIM_PROGRESS_EVERY`` seconds (default 30; read and checked in ``specsim.limits``),
  then one per period, then a last line; a run shorter than the period prints nothing.
  ``SPECSIM_PROGRESS=lines`` forces this mode;
- nothing with ``SPECSIM_PROGRESS=0``.

tqdm throttles its redraws and a line costs one clock read per update, so hot loops may call
``update`` freely.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from specsim.limits import progress_every_s


def _in_notebook() -> bool:
    """A Jupyter kernel is running this code (not merely imported: test tools import it)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except AttributeError:
        return False
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def _mode() -> str:
    """``"bar"``, ``"lines"`` or ``"off"`` (module docstring)."""
    flag = os.environ.get("SPECSIM_PROGRESS")
    if flag is not None:
        if flag in ("0", "", "false", "no", "off"):
            return "off"
        return "lines" if flag == "lines" else "bar"
    return "bar" if sys.stderr.isatty() or _in_notebook() else "lines"


def _clock(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


class _Lines:
    """The log-friendly stand-in for a tqdm bar: one line per period (module docstring)."""

    def __init__(self, total: float, desc: str, unit: str, every_s: float) -> None:
        self.total, self.desc, self.unit, self.every_s = total, desc, unit.strip(), every_s
        self.t0 = time.monotonic()
        self.next_at = self.t0 + every_s
        self.n = 0.0
        self.postfix = ""
        self.printed = False

    def _line(self, now: float) -> str:
        elapsed = now - self.t0
        done = f"{self.n:,.0f}" + (f"/{self.total:,.0f}" if self.total else "")
        text = f"specsim: {self.desc or 'progress'} {done} {self.unit}".rstrip()
        if self.total:
            text += f" ({100.0 * self.n / self.total:.0f}%)"
        text += f", {_clock(elapsed)} elapsed"
        if self.total and 0 < self.n < self.total:
            text += f", ETA {_clock(elapsed * (self.total - self.n) / self.n)}"
        return text + (f" [{self.postfix}]" if self.postfix else "")

    def update(self, n: float) -> None:
        self.n += n
        now = time.monotonic()
        if now >= self.next_at:
            sys.stderr.write(self._line(now) + "\n")
            sys.stderr.flush()
            self.printed = True
            self.next_at = now + self.every_s

    def set_postfix_str(self, text: str, refresh: bool = False) -> None:
        self.postfix = text

    def close(self) -> None:
        if self.printed:  # a run that logged its progress also logs its end
            sys.stderr.write(self._line(time.monotonic()) + ", done\n")
            sys.stderr.flush()


class Progress:
    """``with Progress(total, "replay", unit=" tok") as bar: bar.update(n)``.

    ``total`` 0 or None: no known end (a counter with a rate, no ETA).
    """

    def __init__(self, total: float, desc: str = "", unit: str = "", enabled: bool | None = None):
        self.total = float(total) if total else 0.0
        self.desc = desc
        self.unit = unit
        self.n = 0.0
        if enabled is None:
            mode = _mode()
        elif enabled:  # asked for: a bar on a terminal, lines in a log
            mode = "bar" if sys.stderr.isatty() or _in_notebook() else "lines"
        else:
            mode = "off"
        self.enabled = mode != "off"
        self._bar: Any = None
        if mode == "lines":
            self._bar = _Lines(self.total, desc, unit, progress_every_s())
        elif mode == "bar":
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
