"""A newcomer's run v4 (issue 62): the frictions an operator and a researcher met, each fixed
and checked on the real CLI."""

from __future__ import annotations

import sys

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
