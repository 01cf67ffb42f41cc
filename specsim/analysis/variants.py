"""Policy variants that separate the two halves of zero-overhead scheduling (ZOS).

ZOS changes two things at once: the scheduler's compute runs overlapped with the target step
(its time is hidden), and, to make that possible, the verification budget is computed from
confidences two steps old (lagged). These variants take one half at a time, so the ``zos``
report can price each:

- ``zos_serial``: the lagged budget of ``zos``, but its compute time is added to every step.
- ``fresh_overlapped``: the global search on CURRENT confidences with its time hidden: the
  impossible ideal (a real engine cannot know this step's confidences before the previous step
  ends). It bounds what the lag costs; it is not lossless (Appendix A).

Use them by spec, like any user policy: ``specsim.analysis.variants:zos_serial``. The
scheduler-cost scale the report varies is a profile suffix (``v4-flash-8xh20@sched-x10``),
parsed by ``specsim.sim.cost.profiles.get_profile``.
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
