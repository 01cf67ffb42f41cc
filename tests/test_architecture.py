"""The house's import order (docs/architecture.md), checked on every module's imports.

Every ``import specsim...`` and ``from specsim... import`` in the package is read with ``ast``,
lazy ones inside functions included (a lazy import is still a dependency). The rules:

- a package imports only from its own floor or the floors below it (``LAYERS``);
- two packages on one floor do not import each other both ways (no circles);
- no two-module import circle anywhere;
- torch (and transformers) only in ``specsim.record`` (the torch engine, the other room that
  imported them, was retired at commit 574e4c8).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "specsim"

# Floors, bottom first. A module is placed by its first sub-package under specsim/ (or its own
# name for a top-level module).
LAYERS: list[set[str]] = [
    {"errors", "rng", "registry", "progress", "outputs", "version", "options", "prompts", "limits"},
    {"trace", "policies"},
    {"sim", "lossless"},
    {"record", "serve"},
    {"analysis", "fidelity"},
    {"commands", "cli", "__init__", "__main__"},
]
TORCH_ROOMS = {"record"}
HEAVY = ("torch", "transformers", "accelerate", "gguf", "safetensors")


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _floor(room: str) -> int:
    for i, rooms in enumerate(LAYERS):
        if room in rooms:
            return i
    raise AssertionError(f"specsim.{room} is on no floor: add it to LAYERS and the doc")


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1] if len(parts) > 1 else parts
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, node.lineno))
            found += [(f"{node.module}.{a.name}", node.lineno) for a in node.names]
    return found


def _graph() -> dict[str, list[tuple[str, int]]]:
    return {_module_name(p): _imports(p) for p in sorted(ROOT.rglob("*.py"))}


GRAPH = _graph()
MODULES = set(GRAPH)


def _resolve(name: str) -> str | None:
    """The specsim module an imported name lives in (``specsim.a.b.func`` -> ``specsim.a.b``)."""
    while name:
        if name in MODULES:
            return name
        if "." not in name:
            return None
        name = name.rsplit(".", 1)[0]
    return None


def test_every_room_is_on_a_floor():
    for mod in MODULES:
        _floor(_room(mod))


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_imports_point_down(mod):
    here = _floor(_room(mod))
    for name, line in GRAPH[mod]:
        if not name.startswith("specsim"):
            continue
        dep = _resolve(name)
        if dep is None or _room(dep) == _room(mod):
            continue
        there = _floor(_room(dep))
        assert there <= here, (
            f"{mod} (line {line}) imports {dep}: specsim.{_room(dep)} is above "
            f"specsim.{_room(mod)} in docs/architecture.md"
        )


def test_rooms_on_one_floor_do_not_import_each_other_both_ways():
    edges = set()
    for mod, names in GRAPH.items():
        for name, _ in names:
            dep = _resolve(name) if name.startswith("specsim") else None
            if dep and _room(dep) != _room(mod) and _floor(_room(dep)) == _floor(_room(mod)):
                edges.add((_room(mod), _room(dep)))
    both = sorted((a, b) for a, b in edges if (b, a) in edges and a < b)
    assert not both, f"rooms importing each other: {both}"


def test_no_two_module_circles():
    deps = {
        mod: {d for n, _ in names if n.startswith("specsim") and (d := _resolve(n)) and d != mod}
        for mod, names in GRAPH.items()
    }
    # a package's __init__ re-exporting its modules is not a circle of code
    circles = sorted(
        (a, b)
        for a in deps
        for b in deps[a]
        if a < b and a in deps.get(b, set()) and not (a.startswith(b) or b.startswith(a))
    )
    assert not circles, f"import circles: {circles}"


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_torch_only_in_the_recording_room(mod):
    if _room(mod) in TORCH_ROOMS:
        return
    for name, line in GRAPH[mod]:
        assert name.split(".")[0] not in HEAVY, (
            f"{mod} (line {line}) imports {name}: torch and transformers belong in specsim.record"
        )


def test_the_doc_names_every_room():
    doc = (ROOT.parent / "docs" / "architecture.md").read_text()
    for rooms in LAYERS:
        for room in rooms - {"__init__", "__main__", "cli"}:
            assert f"`{room}" in doc, f"docs/architecture.md does not mention {room}"


# a module a reader can hold in mind: every one, the engine's step included (its phases are
# methods of a step object: sim/step.py, sim/serving.py, sim/batching.py)
MAX_LINES = 500


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_no_module_is_over_500_lines(mod):
    path = ROOT.parent / (mod.replace(".", "/") + ".py")
    if not path.exists():
        path = ROOT.parent / mod.replace(".", "/") / "__init__.py"
    n = len(path.read_text().splitlines())
    assert n <= MAX_LINES, f"{path.relative_to(ROOT.parent)} has {n} lines: split it by concept"


def _top_level_functions() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for p in sorted(ROOT.rglob("*.py")):
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                found.setdefault(node.name, []).append(_module_name(p))
    return found


# rules a test can see: each is defined by exactly one function in the package
ONE_PLACE = {
    "reservation": "specsim.sim.admission",  # the KV a request reserves
    "check_steady_window": "specsim.sim.workload",  # the closed-loop rule (replay and sweep)
    "get_profile": "specsim.sim.cost.profiles",  # profile names, files and @sched-xS
    "check_lossless": "specsim.lossless.api",  # the checker from a notebook
    "record_trace": "specsim.record.api",  # recording from a notebook
}


@pytest.mark.parametrize("name", sorted(ONE_PLACE))
def test_each_rule_is_defined_once(name):
    where = _top_level_functions().get(name, [])
    assert where == [ONE_PLACE[name]], f"{name} is defined in {where}"
