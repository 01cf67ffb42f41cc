"""Policy variants that separate the two halves of zero-overhead scheduling (ZOS).

ZOS changes two things at once: the scheduler's compute runs overlapped with the target step
(its time is hidden), and, to make that possible, the verification budget is computed from
confidences two steps old (lagged). These variants take one half at a time, so the ``zos``
report can price each:

- ``zos_serial``: the lagged budget of ``zos``, but its compute time is added to every step.
- ``fresh_overlapped``: the global search on CURRENT confidences with its time hidden: the
  impossible ideal (a real engine cannot know this step's confidences before the previous step
  ends). It bounds what the lag costs; it is not lossless (Appendix A).

Use them by spec, like any user policy: ``specsim.analysis.variants:zos_serial``.
"""

from __future__ import annotations

from dataclasses import replace

from specsim.policies.base import Policy, get_policy

ZOS_SERIAL = "specsim.analysis.variants:zos_serial"
FRESH_OVERLAPPED = "specsim.analysis.variants:fresh_overlapped"


def zos_serial() -> Policy:
    """``zos``'s lagged budget and dynamic top-K, run serially (no overlap)."""
    return replace(get_policy("zos"), name="zos-serial", zos=False)


def fresh_overlapped() -> Policy:
    """``hw-aware-global`` on current confidences, overlapped as if free (an upper bound)."""
    return replace(get_policy("hw-aware-global"), name="fresh-overlapped", zos=True)


SCHED_SUFFIX = "@sched-x"


def scaled_profile_name(profile: str, scale: float) -> str:
    """``v4-flash-like@sched-x10``: the profile with its scheduler compute cost times 10."""
    return f"{profile}{SCHED_SUFFIX}{scale:g}"


def resolve_profile(spec: str):  # noqa: ANN201 - CostModel, imported lazily
    """A profile spec as :func:`specsim.sim.profiles.get_profile` takes it, plus the suffix
    ``@sched-xS`` that multiplies the scheduler's compute cost (base and per request) by S.

    Why a suffix and not a file: the sweep's cell key is the spec string, so a scaled profile
    is resumable and reproducible without writing megabytes of profile CSV.
    """
    from dataclasses import replace as dc_replace

    from specsim.errors import SpecsimError
    from specsim.sim.profiles import get_profile

    name, sep, scale_text = str(spec).partition(SCHED_SUFFIX)
    if not sep:
        return get_profile(spec)
    try:
        scale = float(scale_text)
    except ValueError:
        scale = float("nan")
    if not (scale >= 0 and scale < float("inf")):
        raise SpecsimError(
            f"profile {spec!r}: the number after {SCHED_SUFFIX} must be a scale >= 0, e.g. "
            f"{name}{SCHED_SUFFIX}10"
        )
    base = get_profile(name)
    return dc_replace(
        base,
        name=str(spec),
        sched_base_us=base.sched_base_us * scale,
        sched_us_per_request=base.sched_us_per_request * scale,
    )
