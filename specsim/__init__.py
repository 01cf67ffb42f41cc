"""specsim: schedule speculative decoding under load.

Record traces of a real drafter and target, replay them in a SimPy serving simulator under any
load and prefix scheduler, and prove schedulers and verifiers lossless.

The public API (docs/api.md) mirrors the CLI as functions returning pandas DataFrames::

    import specsim
    trace = specsim.read_trace("traces/synthetic-chat.parquet")
    result = specsim.replay(trace, "hw-aware", concurrency=32)
    table = specsim.sweep(trace.path, ["mtp1", "zos"], concurrency=[1, 8, 64])
    specsim.plot_pareto(table)

Names are imported on first use, so ``import specsim`` stays fast and never imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from specsim.errors import SpecsimError
from specsim.version import __version__

# public name -> (module, attribute), imported on first access
_LAZY: dict[str, tuple[str, str]] = {
    # traces
    "Trace": ("specsim.trace.model", "Trace"),
    "read_trace": ("specsim.trace.io", "read_trace"),
    "load_trace": ("specsim.trace.io", "read_trace"),
    "write_trace": ("specsim.trace.io", "write_trace"),
    "trace_stats": ("specsim.trace.stats", "trace_stats"),
    "per_position_table": ("specsim.trace.stats", "per_position_table"),
    "synth_trace": ("specsim.trace.synth", "synth_trace"),
    "LogNormal": ("specsim.trace.synth", "LogNormal"),
    # policies and cost profiles
    "Policy": ("specsim.policies.base", "Policy"),
    "StepInput": ("specsim.policies.base", "StepInput"),
    "get_policy": ("specsim.policies.base", "get_policy"),
    "get_profile": ("specsim.sim.cost.profiles", "get_profile"),
    "calibrate_trace": ("specsim.policies.calibrate", "calibrate_trace"),
    # simulation
    "replay": ("specsim.sim.simulate", "replay"),
    "ReplayResult": ("specsim.sim.simulate", "ReplayResult"),
    "ReplayConfig": ("specsim.sim.config", "ReplayConfig"),
    # analysis
    "sweep": ("specsim.analysis.sweep", "sweep"),
    "find_max_load": ("specsim.analysis.maxload", "find_max_load"),
    "throughput_at_sla": ("specsim.analysis.frontier", "throughput_at_sla"),
    "curves": ("specsim.analysis.frontier", "curves"),
    "plot_pareto": ("specsim.analysis.plots", "plot_pareto"),
    "plot_sla": ("specsim.analysis.plots", "plot_sla"),
    "plot_load": ("specsim.analysis.plots", "plot_load"),
    "plot_calibration": ("specsim.analysis.plots", "plot_calibration"),
    "calibration_table": ("specsim.analysis.plots", "calibration_table"),
    "policy_style": ("specsim.analysis.palette", "policy_style"),
    "run_report": ("specsim.analysis.report", "run_report"),
    # recording (needs the record extra; torch is imported only when called)
    "record_trace": ("specsim.record.api", "record_trace"),
    # losslessness
    "check_lossless": ("specsim.lossless.api", "check_lossless"),
    "is_lossless": ("specsim.lossless.api", "is_lossless"),
    "mutant_table": ("specsim.lossless.api", "mutant_table"),
}

__all__ = ["SpecsimError", "__version__", *_LAZY]


def policy_names() -> list[str]:
    """Names of the built-in policies (``static`` and ``threshold`` families take ``:ARG``)."""
    from specsim.policies.base import POLICIES, get_policy

    get_policy("ar")  # registers the built-ins
    return POLICIES.names()


def profile_names() -> list[str]:
    """Names of the built-in cost profiles."""
    from specsim.sim.cost.profiles import PROFILES

    return PROFILES.names()


__all__ += ["policy_names", "profile_names"]


def __getattr__(name: str) -> Any:
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'specsim' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
