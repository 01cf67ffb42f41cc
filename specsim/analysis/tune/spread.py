"""What the profile's assumptions move in ``tune``'s answer: the recommended setting and no
speculation replayed on other profiles (``--spread``), with the same seeds.

Why: a built profile's assumed terms (engine overheads, launch time, sampling passes, the
drafter's fitted costs) each carry a range, and a single gain read off the mid profile looks
like a measurement. ``profile build --assume against`` and ``favour`` put every assumed term at
the end that lowers / raises the gain of speculation (:mod:`specsim.sim.cost.assumed`); the
recommended setting's gain over no speculation on each of them is the range the answer holds
in. Only the recommended setting is replayed (a full search per profile would multiply the
run): whether ANOTHER setting would win under those assumptions is not asked here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specsim.errors import SpecsimError


def check_spread(names: tuple[str, ...] | None) -> list[str]:
    """The ``--spread`` profiles, each loaded once so a missing or malformed one is refused in
    a line before any replay."""
    if not names:
        return []
    from specsim.sim.cost.profiles import get_profile

    for n in names:
        get_profile(n)
    return list(names)


def spread_rows(trace: Any, res: Any) -> list[dict]:
    """Per load and ``--spread`` profile: the recommended setting's and no speculation's mean
    output tok/s over the tune's seeds, and the gain (one row per load for the tune's own
    profile first, ``profile`` = its name)."""
    from specsim.analysis.tune.run import replay_candidate
    from specsim.sim.cost.profiles import get_profile
    from specsim.trace.io import read_trace
    from specsim.trace.model import Trace

    cfg = res.config
    names = check_spread(cfg.spread)
    if not names:
        return []
    tr = trace if isinstance(trace, Trace) else read_trace(trace)
    rows = []
    for lr in res.loads:
        rec = lr.recommended_row
        if rec is None:
            continue
        pool = lr.candidates or res.candidates
        cand = next(c for c in pool if c.label == rec["candidate"])
        none = next(c for c in pool if c.label == lr.rows[lr.no_spec]["candidate"])
        base = {"load": lr.load.describe(), "setting": rec["candidate"]}
        rows.append(
            {
                **base,
                "profile": res.profile,
                **_gain(rec["throughput_tok_s"], lr.rows[lr.no_spec]["throughput_tok_s"]),
            }
        )
        for name in names:
            prof = get_profile(name)
            tok = [np.mean([replay_candidate(tr, c, lr.load, cfg, prof, s)[0]["throughput_tok_s"]
                            for s in cfg.seed_list]) for c in (cand, none)]  # fmt: skip
            rows.append({**base, "profile": name, **_gain(*tok)})
    return rows


def _gain(with_spec: float, without: float) -> dict[str, float]:
    if not without > 0:
        raise SpecsimError("no speculation made no tokens at this load: no gain to spread")
    return {"tok_s": float(with_spec), "none_tok_s": float(without),
            "gain": float(with_spec / without - 1.0)}  # fmt: skip


def spread_text(rows: list[dict]) -> list[str]:
    """Each load's recommended gain over no speculation on the tune's profile, with its span
    over the ``--spread`` profiles."""
    if not rows:
        return []
    lines = ["", "spread (--spread: the recommended setting and no speculation, same seeds):"]
    loads = list(dict.fromkeys(r["load"] for r in rows))
    for load in loads:
        mine = [r for r in rows if r["load"] == load]
        main, others = mine[0], mine[1:]
        gains = [r["gain"] for r in mine]
        lines.append(
            f"  {load}: {main['setting']} {100 * main['gain']:+.1f}% over no speculation "
            f"({100 * min(gains):+.1f}% to {100 * max(gains):+.1f}% over "
            + ", ".join(f"{r['profile']} {100 * r['gain']:+.1f}%" for r in others)
            + ")"
        )
        if min(gains) < 0 < max(gains):
            lines.append("    the sign of the gain depends on the assumptions: measure before "
                         "you decide (specsim profile fit on your baseline)")  # fmt: skip
    return lines


__all__ = ["check_spread", "spread_rows", "spread_text"]
