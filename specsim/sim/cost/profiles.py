"""Cost profiles found by name: built deployments, measured tables and profile CSV files.

Profile CSV format (docs/simulator.md): optional header lines ``# key: value`` holding the scalar
costs (``draft_base_ms``, ``draft_per_request_ms``, ``draft_per_token_ms``, ``sched_base_us``,
``sched_us_per_request``, ``max_running``, ``kv_tokens``, ``max_batched_tokens``, and the measured
engine terms ``step_overhead_ms``, ``verify_per_request_ms``, ``draft_per_context_us``,
``draft_context_window``, ``prefill_token_ms`` (specsim.sim.cost.model); anything else is kept as
metadata),
then a table with columns ``batch_tokens,step_ms`` and optionally ``context_tokens`` (a full
grid: every batch size at every context).

Built-in names: the built deployments ``llama-3-8b-h100``, ``v4-flash-8xh20`` and
``v4-pro-16xh20`` (each one ``specsim profile build`` line, :data:`BUILT`), the measured
``vllm-v4-flash-tp4-b300`` (vLLM's published tables) and every ``specsim/data/profiles/*.csv`` by
its file stem. Why built and not generated: one way to price a step. The hand-set roofline that
made ``h100-dense-8b``, ``v4-flash-like`` and ``v4-pro-like`` was 27-49% high on the gain of
speculation on a held-out dense 8B where ``profile build`` was within 0-6%; it runs at commit
ea0e208, and its names are refused with the name to use instead.
"""

from __future__ import annotations

import functools
import os
from dataclasses import replace
from importlib import resources
from pathlib import Path

from specsim.errors import SpecsimError
from specsim.registry import Registry
from specsim.sim.cost.model import CostModel
from specsim.sim.cost.profile_csv import (  # noqa: F401 - re-exported: the CSV half of profiles
    format_curve,
    parse_curve,
    parse_profile_csv,
    read_profile_csv,
    write_profile_csv,
)

PROFILES: Registry[CostModel] = Registry("profile")

# ------------------------------------------------------------------ built deployments

# Each built-in deployment is one ``specsim profile build`` line, priced by the one cost model
# (specsim.sim.cost.build); ``specsim profile show NAME`` prints it. The DSpark drafter is the
# paper's shape (5 layers of the target's width, a block of 7) on every one. On top of the build,
# each charges a policy that decides its scheduler's compute per step (us, + us per running
# request; hidden under ZOS): ASSUMED, the retired roofline profiles' values, kept so that what
# ZOS hides is not free (profile build charges no scheduler: the engine's loop is its own term).
# benchmarks/bench_policy.py measures specsim's numpy ``auto`` at 150 us (1 request) to 298 us
# (256) on a 2-core CPU: a production scheduler in C++ or on the GPU should cost less.
BUILT: dict[str, tuple[str, dict, tuple[float, float]]] = {
    "llama-3-8b-h100": (
        "built: Llama-3-8B on one H100, vLLM, a DSpark drafter",
        {"model": "llama-3-8b", "gpu": "H100", "drafter": "dspark"},
        (30.0, 0.8),
    ),
    "v4-flash-8xh20": (
        "built: DeepSeek-V4-Flash on 8 H20s (TP 8, EP 8), vLLM, a DSpark drafter",
        {"model": "deepseek-v4-flash", "gpu": "H20", "tp": 8, "ep": 8, "drafter": "dspark"},
        (60.0, 2.0),
    ),
    "v4-pro-16xh20": (
        "built: DeepSeek-V4-Pro on 16 H20s (TP 8, DP 2, EP 16), vLLM, a DSpark drafter",
        {"model": "deepseek-v4-pro", "gpu": "H20", "tp": 8, "dp": 2, "ep": 16,
         "drafter": "dspark"},
        (60.0, 2.0),
    ),
}  # fmt: skip

# The hand-set roofline profiles these replaced (house v4, issue 65): the last commit that runs
# them, and the built deployment to use instead.
RETIRED_COMMIT = "ea0e208"
RETIRED = {
    "h100-dense-8b": "llama-3-8b-h100",
    "v4-flash-like": "v4-flash-8xh20",
    "v4-pro-like": "v4-pro-16xh20",
}


def build_line(spec: dict) -> str:
    """The ``specsim profile build`` command a built-in name stands for."""
    flags = " ".join(f"--{k} {v}" for k, v in spec.items())
    return f"specsim profile build {flags}"


def _register_built(name: str, help_text: str, spec: dict, sched: tuple[float, float]) -> None:
    @PROFILES.register(name, help=f"{help_text} ({build_line(spec)})")
    @functools.cache
    def factory(arg: str | None = None) -> CostModel:
        from specsim.sim.cost.build import Deployment
        from specsim.sim.cost.build_profile import build
        from specsim.sim.cost.models import model_arch

        dep = Deployment(**{**spec, "model": model_arch(spec["model"])})
        model = build(dep)[0]
        model.meta["built_as"] = build_line(spec)
        model.meta["scheduler"] = (
            f"{sched[0]:g} us + {sched[1]:g} us per running request a decision (ASSUMED: "
            "specsim's built-in deployments, not profile build)"
        )
        return replace(model, name=name, sched_base_us=sched[0], sched_us_per_request=sched[1])


for _name, (_help, _spec, _sched) in BUILT.items():
    _register_built(_name, _help, _spec, _sched)


@PROFILES.register(
    "vllm-v4-flash-tp4-b300",
    help="measured: vLLM's adaptive-verification tables, V4-Flash TP4 on B300",
)
@functools.cache
def _vllm_v4_flash_tp4_b300(arg: str | None = None) -> CostModel:
    """vLLM's published startup profile (fig. 2 of its adaptive-verification post), read as vLLM
    reads it: running maximum, a staircase to the 1,024-token capture limit, eager past it.

    What the post does not give is assumed and said so: 256 running requests (its benchmark's
    largest concurrency), a KV cache of 4M tokens (4 x 288 GB of B300 HBM less the checkpoint:
    not a limit at that concurrency) and vLLM's default 8,192 batched tokens a step.
    """
    from specsim.sim.cost.profile_import import from_vllm_adaptive

    folder = resources.files("specsim") / "data" / "published" / "vllm-adaptive-verification"
    model = from_vllm_adaptive(
        str(folder / "verify_cost.csv"),
        str(folder / "draft_cost.csv"),
        name="vllm-v4-flash-tp4-b300",
        max_running=256,
        kv_tokens=4_000_000,
        gpus=4,
    )
    model.meta["source"] = (
        "vLLM blog 'Adaptive Verification in vLLM' (2026-08-14), fig. 2: DeepSeek-V4-Flash-0731, "
        "TP=4 on B300, 440 profiled steps (specsim/data/published/vllm-adaptive-verification)"
    )
    model.meta["assumed"] = "max_running 256, kv_tokens 4,000,000 (not in the post)"
    return model


def register_csv_folder(folder=None) -> list[str]:
    """Register every ``*.csv`` in ``folder`` (default: ``specsim/data/profiles/``) under its
    file stem; names already taken are left alone. Returns the names added."""
    try:
        if folder is None:
            folder = resources.files("specsim") / "data" / "profiles"
        entries = sorted(folder.iterdir(), key=lambda e: e.name) if folder.is_dir() else []
    except (FileNotFoundError, ModuleNotFoundError):
        entries = []
    added = []
    for entry in entries:
        if not entry.name.endswith(".csv"):
            continue
        stem = entry.name[:-4]
        if stem in PROFILES:
            continue

        def factory(arg: str | None = None, _e=entry, _s=stem) -> CostModel:
            return parse_profile_csv(_e.read_text(), _s, source=str(_e))

        PROFILES.register(stem, help=f"profile CSV {entry.name}")(factory)
        added.append(stem)
    return added


register_csv_folder()


SCHED_SUFFIX = "@sched-x"


def scaled_profile_name(profile: str, scale: float) -> str:
    """``v4-flash-like@sched-x10``: the profile with its scheduler compute cost times 10."""
    return f"{profile}{SCHED_SUFFIX}{scale:g}"


def _sched_scaled(spec: str) -> CostModel:
    """``NAME@sched-xS``: the profile NAME with the scheduler's compute cost (base and per
    request) times S. A suffix, not a file, so a sweep row's profile string replays on its own
    (the cell key is the spec) without writing megabytes of profile CSV."""
    name, _, scale_text = spec.partition(SCHED_SUFFIX)
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
    return replace(
        base,
        name=spec,
        sched_base_us=base.sched_base_us * scale,
        sched_us_per_request=base.sched_us_per_request * scale,
    )


def get_profile(spec: str | CostModel | os.PathLike) -> CostModel:
    """A built-in name, a path to a profile CSV, or a CostModel (returned as is); either name
    may end in ``@sched-xS`` (scheduler compute cost times S)."""
    if isinstance(spec, CostModel):
        return spec
    s = str(spec)
    if SCHED_SUFFIX in s:
        return _sched_scaled(s)
    if s.endswith(".csv") or os.sep in s or Path(s).is_file():
        return read_profile_csv(s)
    if s in PROFILES:
        return PROFILES.get(s)
    if s in RETIRED:
        raise SpecsimError(
            f"profile {s!r} was a hand-set roofline, retired after commit {RETIRED_COMMIT}; use "
            f"{RETIRED[s]!r} (the same deployment built from measured operators), or check out "
            f"{RETIRED_COMMIT} to replay with the old one"
        )
    if Path(s).is_dir():  # a folder is a path too: the reader says what to pass instead
        return read_profile_csv(s)
    close = [n for n in PROFILES.names() if n.startswith(s[:3])]
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise SpecsimError(
        f"unknown profile {s!r}{hint}; valid names: {', '.join(PROFILES.names())}, "
        "or a path to a profile CSV"
    )


def describe(model: CostModel) -> str:
    """One line per key point of a profile, for docs and the CLI."""
    pts = [1, 8, 64, 128, 256, 512, 640, 1024, 2048]
    cells = [f"B={b}: {model.step_time(b) * 1000:.2f} ms" for b in pts]
    return f"{model.name}: " + ", ".join(cells) + f"; knee/bmax {model.b_max}"


__all__ = [
    "BUILT",
    "PROFILES",
    "RETIRED",
    "build_line",
    "CostModel",
    "describe",
    "get_profile",
    "parse_profile_csv",
    "read_profile_csv",
    "register_csv_folder",
    "scaled_profile_name",
    "write_profile_csv",
]
