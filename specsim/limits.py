"""The limits a user may raise through the environment, each read and checked in one place.

Why a module of their own: every command reads them (``specsim.cli`` checks them all before a
command runs, so a typo fails on every command, not only on the one that reaches the limit),
and the readers must stay cheap to import (no numpy, no pandas).
"""

from __future__ import annotations

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


def _whole(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise SpecsimError(
            f"{name}={raw!r} must be a whole number (default {default:,}); fix or unset it"
        ) from None
    if value < 1:
        raise SpecsimError(f"{name}={raw!r} must be at least 1 (default {default:,})")
    return value


def max_requests() -> int:
    """The request limit in force (``SPECSIM_MAX_REQUESTS`` or 5,000,000)."""
    return _whole(MAX_REQUESTS_ENV, DEFAULT_MAX_REQUESTS)


def max_cells() -> int:
    """The cell limit of one sweep in force (``SPECSIM_MAX_CELLS`` or 20,000)."""
    return _whole(MAX_CELLS_ENV, DEFAULT_MAX_CELLS)


def check_environment() -> None:
    """Refuse a malformed limit (and progress interval) before any command runs."""
    from specsim.progress import every_s

    max_requests()
    max_cells()
    every_s()
