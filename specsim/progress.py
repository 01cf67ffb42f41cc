"""A dependency-free progress bar on stderr.

Shown when stderr is a terminal (or ``SPECSIM_PROGRESS=1``); silent otherwise or when
``SPECSIM_PROGRESS=0``, so logs and tests stay clean. Throttled to ~10 redraws a second so it
costs nothing on hot loops.
"""

from __future__ import annotations

import os
import sys
import time


def _enabled() -> bool:
    flag = os.environ.get("SPECSIM_PROGRESS")
    if flag is not None:
        return flag not in ("0", "", "false", "no")
    return sys.stderr.isatty()


class Progress:
    """``with Progress(total, "replay") as bar: bar.update(n)``."""

    def __init__(self, total: float, desc: str = "", unit: str = "", enabled: bool | None = None):
        self.total = float(total) if total else 0.0
        self.desc = desc
        self.unit = unit
        self.n = 0.0
        self.enabled = _enabled() if enabled is None else enabled
        self._t0 = time.perf_counter()
        self._last = 0.0

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: float = 1.0) -> None:
        self.n += n
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self._last >= 0.1:
            self._last = now
            self._draw(now)

    def set(self, n: float) -> None:
        self.update(n - self.n)

    def _draw(self, now: float) -> None:
        el = now - self._t0
        if self.total > 0:
            frac = min(1.0, self.n / self.total)
            width = 30
            fill = int(frac * width)
            bar = "#" * fill + "-" * (width - fill)
            eta = el / frac - el if frac > 0 else float("nan")
            msg = (
                f"\r{self.desc} [{bar}] {frac * 100:5.1f}% {self.n:,.0f}/{self.total:,.0f}"
                f"{self.unit} {el:5.1f}s eta {eta:5.1f}s"
            )
        else:
            msg = f"\r{self.desc} {self.n:,.0f}{self.unit} {el:5.1f}s"
        sys.stderr.write(msg)
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            self._draw(time.perf_counter())
            sys.stderr.write("\n")
            sys.stderr.flush()
            self.enabled = False
