"""``specsim profile fit``: the built profile anchored on the operator's runs without
speculation (:mod:`specsim.sim.cost.fit`), and its printout: each fitted term beside the
build's, each run's residual."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from specsim.errors import SpecsimError


def run_fit(args: argparse.Namespace) -> int:
    """``profile fit``: the built profile, its free terms fitted to the baseline runs."""
    from specsim.commands.profile import _same_file
    from specsim.outputs import claim
    from specsim.sim.cost.baseline import read_baseline
    from specsim.sim.cost.fit import fit, fitted_profile
    from specsim.sim.cost.profile_csv import write_profile_csv

    for f in args.baseline:
        if _same_file(Path(f), args.out):
            raise SpecsimError(f"--out {str(args.out)!r} is also a --baseline; write elsewhere")
    given = getattr(args, "profile", None)
    if given and Path(given).exists() and _same_file(Path(given), args.out):
        raise SpecsimError(f"--out {str(args.out)!r} is the --profile it anchors; write elsewhere")
    with claim(args.out, force=args.force, suffixes=(".csv",)) as out:
        points = [pt for f in args.baseline for pt in read_baseline(f)]  # before any work
        model = _base(args)
        result = fit(model, points)
        fitted = fitted_profile(model, result)
        write_profile_csv(fitted, out, force=True)
    print(fit_text(result, fitted))
    print(f"wrote {out}; replay with --profile {out}", file=sys.stderr)
    return 0


def _base(args: argparse.Namespace) -> Any:
    """The profile to anchor: ``--profile`` as given, or the deployment built; one of them."""
    from specsim.commands.profile_args import _deployment
    from specsim.sim.cost.build_profile import build

    given = getattr(args, "profile", None)
    if given is not None and args.model is not None:
        raise SpecsimError("profile fit: give --model (and the deployment) or --profile, not both")
    if given is None and args.model is None:
        raise SpecsimError(
            "profile fit needs the deployment (--model, --gpu ...) or a profile to anchor "
            "(--profile NAME_OR_CSV)"
        )
    if given is not None:
        from specsim.sim.cost.profiles import get_profile

        return get_profile(given)
    return build(_deployment(args))[0]


def fit_text(result: Any, fitted: Any) -> str:
    """Each fitted term beside the build's, and each run: measured against fitted TPOT."""
    lines = [
        f"{fitted.name}: fitted on {len(result.points)} runs without speculation "
        f"({', '.join(result.fitted)} fitted; the drafter as given)",
        "  term                       built       fitted",
        f"  GPU time (x the build)     1.000   {result.scale:10.3f}",
        f"  step fixed cost (ms)  {result.built_step_ms:10.3f}   {result.step_ms:10.3f}",
        f"  per request (us)      {result.built_per_request_ms * 1000:10.1f}   "
        f"{result.per_request_ms * 1000:10.1f}",
        "  run                                              TPOT measured   fitted   residual",
    ]
    for p, pred, r in zip(result.points, result.predicted_tpot_ms, result.residuals,
                          strict=True):  # fmt: skip
        lines.append(f"  {p.describe():<48} {p.mean_tpot_ms:10.2f} {pred:8.2f} {100 * r:+9.1f}%")
    if result.step_ms < 0:
        lines.append("  the step cost is below zero: the base's fixed cost a step is above the "
                     "runs', so it is taken off the profile's table")  # fmt: skip
    lines.append(f"  residual: TPOT {result.residual_text()} (the fitted terms' own runs)")
    return "\n".join(lines)


__all__ = ["fit_text", "run_fit"]
