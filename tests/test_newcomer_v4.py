"""A newcomer's run v4 (issue 62): the frictions an operator and a researcher met, each fixed
and checked on the real CLI."""

from __future__ import annotations

import sys

import pytest

from specsim.cli import main


def test_a_verifier_module_in_the_current_folder_is_found(tmp_path, monkeypatch, capsys):
    """``--verifier mymod:fn`` beside ``mymod.py`` imports as ``python -m`` would (a console
    script does not put the folder on sys.path): the error is about the verifier, not import."""
    (tmp_path / "mymod_v4.py").write_text("def fn(p, q, x, u, v):\n    return None\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert main(["check-lossless", "--verifier", "mymod_v4:fn", "--checks", "exact"]) == 2
    err = capsys.readouterr().err
    assert "cannot import" not in err and "must return a pair" in err, err


@pytest.mark.slow
def test_lossy_worlds_each_get_a_counterexample_and_case_names_are_whole(
    tmp_path, monkeypatch, capsys
):
    """A plug-in with a long name: every case line holds its whole name, and every lossy world
    shows its counterexample (3 of 6 were shown)."""
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "examples" / "lossless" / "my_verifier.py"
    name = "a_verifier_module_with_a_rather_long_name_v4"
    (tmp_path / f"{name}.py").write_text(src.read_text())
    monkeypatch.chdir(tmp_path)
    assert main(["check-lossless", "--verifier", f"{name}:verify_buggy", "--checks", "exact"]) == 1
    out = capsys.readouterr().out
    cases = [ln for ln in out.splitlines() if ln.startswith(f"{name}:verify_buggy + full @ ")]
    assert len(cases) == 6 and all(" exact " in ln for ln in cases), out
    worlds = {ln.split(" @ ")[1].split()[0] for ln in cases}
    shown = {ln.split("(")[1].split(",")[0] for ln in out.splitlines()
             if ln.startswith("counterexample (")}  # fmt: skip
    assert shown == worlds, (shown, worlds)


@pytest.mark.slow
def test_execute_py_keeps_a_copy_in_your_folder_without_force(tmp_path):
    """A copy of the same name in a folder of yours is yours: kept without --force (the
    default, git-ignored notebooks/executed/ is execute.py's own and is refreshed)."""
    import subprocess
    from pathlib import Path

    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1 + 1")])
    book = tmp_path / "tiny.ipynb"
    nbformat.write(nb, book)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "tiny.ipynb").write_text("my own notes")
    script = Path(__file__).resolve().parents[1] / "notebooks" / "execute.py"

    def run(*extra: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, str(script), str(book), "--out", str(out), *extra]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300)

    first = run()
    assert first.returncode == 2 and "pass --force" in first.stderr, first.stderr
    assert (out / "tiny.ipynb").read_text() == "my own notes"
    again = run("--force")
    assert again.returncode == 0, again.stderr
    assert nbformat.read(out / "tiny.ipynb", as_version=4).cells[0].outputs == []


def test_an_ngram_drafter_spec_that_is_not_one_is_one_line(capsys):
    import pytest

    from specsim.errors import SpecsimError
    from specsim.record.api import load_drafter_spec

    for bad in ("ngram:x", "ngram:0", "ngram:³", "ngramx", "ngram:99"):
        with pytest.raises(SpecsimError, match="ngram:N with N a whole number 1..64"):
            load_drafter_spec(bad, None, None)
