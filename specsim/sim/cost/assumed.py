"""An assumed fact: its low, mid and high values and why, as every priced term that is not
measured carries it (``profile build --assume low|mid|high`` writes one of the three).

A gain of speculation is a RATIO of two steps' costs, and moving every term to its low (or high)
end moves both steps together: those two corners do not bracket the gain. So each fact also
says which way its HIGH value moves the gain (``spec``): a per-step cost (the loop's fixed cost,
launches, a collective's latency) is paid once a step and speculation takes fewer steps (+1);
a per-verified-token or drafter cost is paid for every draft (-1). The two corners ``against``
and ``favour`` put every fact at the end that lowers or raises the gain, and their predictions
are the printed range of a gain (``profile build --assume against|favour``).
"""

from __future__ import annotations

from dataclasses import dataclass

CORNERS = ("against", "favour")  # every term at the end that lowers / raises a speculative gain


@dataclass(frozen=True)
class Assumed:
    """A fact assumed, not measured: its range, why, and which way its high value moves the
    gain of speculation (``spec``: +1 raises it, -1 lowers it, 0 neither or unknown)."""

    low: float
    mid: float
    high: float
    why: str
    spec: int = 0

    def at(self, point: str) -> float:
        """The value at ``point``: low, mid or high, or a corner (the end that lowers /
        raises a speculative gain; mid for a fact that moves neither)."""
        if point in CORNERS:
            sign = self.spec if point == "favour" else -self.spec
            return self.high if sign > 0 else self.low if sign < 0 else self.mid
        return float(getattr(self, point))


__all__ = ["CORNERS", "Assumed"]
