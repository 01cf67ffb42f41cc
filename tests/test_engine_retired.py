"""``specsim engine`` is retired (issue 65): whatever it is given, one line on stderr naming the
commit that still runs the torch engine and what to use instead, exit 2, nothing written; the
command stays registered, so an old script gets that line and not argparse's "invalid choice"."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from specsim.cli import main
from specsim.commands.engine import RETIRED_AT

ROOT = Path(__file__).resolve().parents[1]

OLD_CALLS = [
    [],
    ["--prompts", "humaneval[:8]", "--concurrency", "4", "--clock", "ref", "--threads", "1"],
    ["--target", "smollm2", "--drafter", "ngram:3", "--device", "cpu", "--rate", "2"],
    ["--no-such-flag", "x", "-q", "--", "rest"],
]


@pytest.mark.parametrize("extra", OLD_CALLS)
def test_one_line_exit_2_names_the_commit_writes_nothing(extra, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["engine", *extra, "--out", str(out), "--force"]) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    lines = cap.err.splitlines()
    assert len(lines) == 1, cap.err
    line = lines[0]
    assert line.startswith("specsim: error: specsim engine") and "retired" in line
    assert f"commit {RETIRED_AT}" in line
    for instead in ("specsim replay", "specsim validate --engine llama-server", "specsim bench"):
        assert instead in line
    assert "Traceback" not in cap.err
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_says_so_and_exits_0(flag, capsys):
    assert main(["engine", flag]) == 0
    cap = capsys.readouterr()
    assert "retired" in cap.out and f"commit {RETIRED_AT}" in cap.out and cap.err == ""


def test_listed_in_the_commands_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"engine retired (specsim's own torch engine; runs from commit {RETIRED_AT})" in out


def test_the_torch_engine_is_gone_here():
    """No module of it is left, and nothing in the package imports it."""
    assert not list((ROOT / "specsim" / "torch_engine").glob("*.py"))
    for path in (ROOT / "specsim").rglob("*.py"):
        assert "specsim.torch_engine" not in path.read_text(), path


def test_the_commit_named_runs_it():
    """The commit the line names holds the engine (where this checkout has that history)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")

    def has(obj: str) -> bool:
        git = ["git", "-C", str(ROOT), "cat-file", "-e", obj]
        return subprocess.run(git, capture_output=True).returncode == 0

    if not has(f"{RETIRED_AT}^{{commit}}"):
        pytest.skip(f"commit {RETIRED_AT} is not in this clone's history")
    assert has(f"{RETIRED_AT}:specsim/torch_engine/engine.py")
    assert has(f"{RETIRED_AT}:specsim/torch_engine/cost_calibration.py")
