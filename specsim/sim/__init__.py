"""The serving simulator: cost profiles, workloads, the SimPy engine, metrics and ``replay()``.

See docs/simulator.md. Names are loaded on first use so ``import specsim.sim`` stays light.
"""

_LAZY = {
    "replay": "specsim.sim.simulate",
    "ReplayResult": "specsim.sim.simulate",
    "CostModel": "specsim.sim.cost.model",
    "get_profile": "specsim.sim.cost.profiles",
    "PROFILES": "specsim.sim.cost.profiles",
    "read_profile_csv": "specsim.sim.cost.profiles",
    "write_profile_csv": "specsim.sim.cost.profiles",
    "make_workload": "specsim.sim.workload",
    "iid_trace": "specsim.sim.toy",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'specsim.sim' has no attribute {name!r}")
