"""The limits a user may raise through the environment, each read and checked in one place.

Why a module of their own: every command reads them (``specsim.cli`` checks them all before a
command runs, so a typo fails on every command, not only on the one that reaches the limit),
and the readers must stay cheap to import (no numpy, no pandas).
"""

from __future__ import annotations

import math
import os

from specsim.errors import SpecsimError

# The most requests one replay may simulate (memory is ~100 bytes a request in the workload and
# the per-request table; the time, about output tokens / 1M seconds).
MAX_REQUESTS_ENV = "SPECSIM_MAX_REQUESTS"
DEFAULT_MAX_REQUESTS = 5_000_000
# The most cells one sweep may have: a mistyped ``--seeds 100000`` is refused at once instead of
# running for hours.
MAX_CELLS_ENV = "SPECSIM_MAX_CELLS"
DEFAULT_MAX_CELLS = 20_000
# Seconds between progress lines in a log (specsim.progress).
PROGRESS_EVERY_ENV = "SPECSIM_PROGRESS_EVERY"
DEFAULT_PROGRESS_EVERY_S = 30.0


def _refuse(name: str, raw: str, rule: str, default: str, hint: str = "") -> SpecsimError:
    """The one line for a malformed limit: the variable, its value, the rule, the default."""
    return SpecsimError(f"{name}={raw!r} must be {rule} (default {default}){hint}; fix or unset it")


def _whole(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise _refuse(name, raw, "a whole number", f"{default:,}") from None
    if value < 1:
        raise _refuse(name, raw, "at least 1", f"{default:,}")
    return value


def _seconds(name: str, default: float, hint: str = "") -> float:
    """A finite number of seconds > 0: 0 or less would mean "at every step" (a flood), not
    "never", and inf or nan is no period at all."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise _refuse(name, raw, "a finite number of seconds > 0", f"{default:g}", hint)
    return value


def max_requests() -> int:
    """The request limit in force (``SPECSIM_MAX_REQUESTS`` or 5,000,000)."""
    return _whole(MAX_REQUESTS_ENV, DEFAULT_MAX_REQUESTS)


def max_cells() -> int:
    """The cell limit of one sweep in force (``SPECSIM_MAX_CELLS`` or 20,000)."""
    return _whole(MAX_CELLS_ENV, DEFAULT_MAX_CELLS)


def progress_every_s() -> float:
    """Seconds between progress lines in a log (``SPECSIM_PROGRESS_EVERY`` or 30)."""
    return _seconds(
        PROGRESS_EVERY_ENV, DEFAULT_PROGRESS_EVERY_S, "; SPECSIM_PROGRESS=0 turns progress off"
    )


def check_environment() -> None:
    """Refuse a malformed limit (and progress interval) before any command runs."""
    max_requests()
    max_cells()
    progress_every_s()
