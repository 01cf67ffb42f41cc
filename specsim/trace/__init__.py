"""Trace format v1: what a drafter proposed and the target accepted, per decoding position.

See docs/trace-format.md. The in-memory form is :class:`specsim.trace.model.Trace`.
"""

from specsim.trace.model import TRACE_VERSION, Trace

__all__ = ["TRACE_VERSION", "Trace"]
