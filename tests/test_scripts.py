"""Every script under benchmarks/ and scripts/ answers ``--help`` (exit 0, a usage line): a
smoke test that it still imports against the package after a refactor moved things."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted([*(ROOT / "benchmarks").glob("*.py"), *(ROOT / "scripts").glob("*.py")])


def test_there_are_scripts():
    assert len(SCRIPTS) >= 10  # the benchmarks and the maintenance scripts


@pytest.mark.slow  # fast suite under 5 min: over 2.8 s alone (CI runs it)
@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_script_answers_help(path):
    out = subprocess.run(
        [sys.executable, str(path), "--help"], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage:" in out.stdout


@pytest.mark.parametrize("folder", ["benchmarks"])
def test_each_script_has_its_section(folder):
    """Each script is described (with its dated answer or numbers) in its folder's README."""
    readme = (ROOT / folder / "README.md").read_text()
    missing = [p.name for p in (ROOT / folder).glob("*.py") if p.name not in readme]
    missing = [m for m in missing if m != "numpy_bound.py" or "numpy_bound" not in readme]
    assert not missing, f"{folder}/README.md does not describe {missing}"
