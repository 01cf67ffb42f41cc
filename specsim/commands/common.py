"""Flags that several commands share, declared once (names, defaults and help alike).

The built-in policy and profile names are spelled out here so that ``--help`` lists them without
importing numpy (``tests/test_cli.py`` keeps them equal to the registries).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import warnings
from collections.abc import Iterator

from specsim.errors import SpecsimError

# In the order ``--help`` lists them: what a user should try first comes first.
POLICY_NAMES = (
    "auto", "calibrated-zos", "hw-aware", "zos", "goodput", "mtp1", "static:K", "full", "ar",
    "threshold:T", "cum-threshold:T", "oracle", "hw-aware-global", "vllm-adaptive",
    "trtllm-confidence:G", "trtllm-schedule:B=K", "sglang-dspark:G", "llama-dspark:P",
)  # fmt: skip
PROFILE_NAMES = (
    "llama-3-8b-h100", "v4-flash-8xh20", "v4-pro-16xh20", "vllm-v4-flash-tp4-b300",
    "smollm2-135m-cpu",
)  # fmt: skip

POLICY_HELP = (
    f"scheduler: {', '.join(POLICY_NAMES)}, or module:callable for your own (docs/policies.md)"
)
PROFILE_HELP = f"cost profile: {', '.join(PROFILE_NAMES)}, or a CSV file (docs/simulator.md)"


def add_profile(p: argparse.ArgumentParser) -> None:
    from specsim.sim.config import default  # light: dataclasses only

    p.add_argument(
        "--profile", default=default("profile"), help=f"{PROFILE_HELP} ({default('profile')})"
    )


def add_seed(p: argparse.ArgumentParser, what: str = "random seed") -> None:
    from specsim.sim.config import default

    p.add_argument("--seed", type=int, default=default("seed"), help=f"{what} ({default('seed')})")


def add_burstiness(p: argparse.ArgumentParser) -> None:
    """``--cv`` and vLLM's ``--burstiness`` for the same Gamma arrival process."""
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--burstiness",
        type=float,
        help="with --rate: Gamma arrivals of shape B as vLLM's benchmark_serving names it "
        "(1 = Poisson, < 1 burstier); CV = 1/sqrt(B)",
    )
    g.add_argument("--cv", type=float, help="with --rate: Gamma gaps of this CV (> 1: bursts)")


def resolve_cv(args: argparse.Namespace) -> float | None:
    """The coefficient of variation of the arrival gaps from ``--cv`` or ``--burstiness``."""
    b = getattr(args, "burstiness", None)
    if b is None:
        return args.cv
    if not (math.isfinite(b) and b > 0):
        raise SpecsimError(f"--burstiness must be a positive number, got {b}")
    return 1.0 / math.sqrt(b)


def add_threads(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: timings are per core, and on a shared CPU more "
        "threads spin and run slower; 0 = torch's default)",
    )


DRAFTER_HELP = (
    "'dspark' (the current DSpark drafter, v3: the one llama.cpp's draft-dspark runs; also "
    "'dspark-v3'), 'dspark-v2' (the one the traces without -v3 in their name were recorded "
    "with), each shipped for the target or from the cache; a DSpark checkpoint folder, or "
    "'ngram[:N]' (prompt lookup, no training)"
)


@contextlib.contextmanager
def plain_warnings() -> Iterator[None]:
    """Python warnings raised inside, printed as one ``specsim: warning: ...`` line each (as
    replay prints them), not as Python's default two lines naming a source file and quoting the
    code that warned: a user of the command did not write that code."""

    def show(message, category, filename, lineno, file=None, line=None) -> None:  # noqa: ANN001
        sys.stderr.write(f"specsim: warning: {message}\n")

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield
