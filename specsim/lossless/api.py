"""Losslessness checks as one call a notebook can make: ``check_lossless("zos")``.

A thin front over the checker (the same functions ``specsim check-lossless`` and the ``lossless``
report run): build the pipeline a policy or a verifier names, run the exact, edge-uniform and
statistical checks over the standard toy worlds, return the tidy table. Exported as
``specsim.check_lossless``, ``specsim.is_lossless`` and ``specsim.mutant_table``.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

CHECKS = ("exact", "edge", "statistical")


def check_lossless(
    policy: Any = "full",
    *,
    verifier: str | None = None,
    multi: bool = False,
    seed: int = 0,
    samples: int = 50_000,
    checks: tuple[str, ...] = CHECKS,
) -> pd.DataFrame:
    """One row per (world, check): ``tv``, ``p_value``, ``lossless``, the ``law`` it covers and
    a ``detail``.

    ``policy``: a registry name (``"hw-aware"``), a :class:`Policy`, or ``module:callable``; it
    schedules the verified prefix of reference rejection sampling. ``verifier``: your own
    ``module:callable`` verifier instead of the reference (``multi`` for a multi-draft one).
    """
    from specsim.lossless.check import check_pipeline
    from specsim.lossless.pipeline import Pipeline

    if verifier is not None:
        from specsim.lossless.user import verifier_pipeline

        pipe = verifier_pipeline(verifier, policy if isinstance(policy, str) else "full", multi)
    else:
        name = policy if isinstance(policy, str) else getattr(policy, "name", "policy")
        pipe = Pipeline(name=f"rejection + {name}", scheduler=policy)
    return check_pipeline(pipe, seed=seed, samples=samples, checks=tuple(checks), progress=False)


def is_lossless(table: pd.DataFrame) -> bool:
    """The verdict of a :func:`check_lossless` table: every check passed."""
    return bool(table["lossless"].all())


def mutant_table(seed: int = 0, samples: int = 50_000) -> pd.DataFrame:
    """Every mutant of the catalogue (known ways to break losslessness), whether each check
    that should catch it did (``caught``), with its exact TV and G-test p-value."""
    from specsim.lossless.report import mutant_table as _table

    return _table(seed=seed, samples=samples)
