"""docs/api.md is executable: its python blocks run in order, and it documents every public
name. Plus: ``import specsim`` stays light (no torch, no pandas until a name is used)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import specsim

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "api.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def test_every_public_name_is_documented():
    text = DOC.read_text(encoding="utf-8")
    missing = [n for n in specsim.__all__ if n != "__version__" and n not in text]
    assert not missing, f"docs/api.md does not mention {missing}"


def test_every_public_name_resolves():
    for name in specsim.__all__:
        assert getattr(specsim, name) is not None
    with pytest.raises(AttributeError):
        specsim.no_such_name  # noqa: B018


@pytest.mark.slow  # fast suite under 5 min: over 2.8 s alone (CI runs it)
def test_doc_examples_run_in_order(tmp_path, monkeypatch, capsys):
    blocks = _blocks()
    assert len(blocks) >= 8
    (tmp_path / "traces").symlink_to(ROOT / "traces")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPECSIM_PROGRESS", "0")
    namespace: dict = {"__name__": "api_doc"}
    for i, code in enumerate(blocks):
        try:
            exec(compile(code, f"docs/api.md block {i + 1}", "exec"), namespace)  # noqa: S102
        except Exception as exc:  # pragma: no cover - the message names the block
            raise AssertionError(f"docs/api.md block {i + 1} failed: {exc!r}\n{code}") from exc
    out = capsys.readouterr().out
    assert "does not exist" in out  # the error example printed its one-line message
    assert (tmp_path / "results.parquet").is_file()
    assert (tmp_path / "pareto-and-sla.png").stat().st_size > 10_000


def test_import_is_light():
    code = (
        "import sys, specsim; "
        "heavy = [m for m in ('torch', 'transformers', 'pandas', 'matplotlib', 'simpy') "
        "if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "[]"
