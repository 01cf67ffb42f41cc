"""A wheel, not the checkout: the Quickstart's trace and the package data travel with it."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_wheel_runs_the_quickstart_away_from_the_checkout(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation",
         "-q", "-w", str(wheels)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    (wheel,) = wheels.glob("specsim-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        zf.extractall(site)
    for data in ("traces/chat.parquet", "traces/README.md", "profiles", "drafters", "prompts"):
        assert any(n.startswith(f"specsim/data/{data}") for n in names), data
    away = tmp_path / "elsewhere"
    away.mkdir()
    env = {**os.environ, "PYTHONPATH": str(site), "SPECSIM_PROGRESS": "0"}
    proc = subprocess.run(
        [sys.executable, "-c", "import sys, specsim.cli; sys.exit(specsim.cli.main(sys.argv[1:]))",
         "replay", "traces/chat.parquet", "--policy", "auto", "--concurrency", "4",
         "--requests", "16", "--json"],
        cwd=away, capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert '"requests_completed": 16' in proc.stdout
    assert str(site) in subprocess.run(
        [sys.executable, "-c", "import specsim; print(specsim.__file__)"],
        cwd=away, capture_output=True, text=True, env=env, check=True,
    ).stdout  # the wheel's copy ran, not the checkout's  # fmt: skip
