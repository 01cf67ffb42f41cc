"""Trace format v1: what a drafter proposed and the target accepted, per decoding position.

See docs/trace-format.md. The in-memory form is :class:`specsim.trace.model.Trace`.
"""

from specsim.trace.model import TRACE_VERSION, Trace

# Loaded on first use, so importing the model alone stays light (no pyarrow/pandas/scipy).
_LAZY = {
    "read_trace": "specsim.trace.io",
    "write_trace": "specsim.trace.io",
    "trace_to_frame": "specsim.trace.io",
    "trace_to_table": "specsim.trace.io",
    "load_meta": "specsim.trace.io",
    "validate_file": "specsim.trace.io",
    "validate_table": "specsim.trace.validate",
    "trace_stats": "specsim.trace.stats",
    "per_position_table": "specsim.trace.stats",
    "synth_trace": "specsim.trace.synth",
    "PROFILES": "specsim.trace.synth",
}

__all__ = ["TRACE_VERSION", "Trace", *_LAZY]


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'specsim.trace' has no attribute {name!r}")
