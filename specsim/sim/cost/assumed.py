"""An assumed fact: its low, mid and high values and why, as every priced term that is not
measured carries it (``profile build --assume low|mid|high`` writes one of the three)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Assumed:
    """A fact assumed, not measured: its range and why."""

    low: float
    mid: float
    high: float
    why: str

    def at(self, point: str) -> float:
        return float(getattr(self, point))


__all__ = ["Assumed"]
