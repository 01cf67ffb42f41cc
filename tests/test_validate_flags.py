"""``specsim validate --engine llama-server`` checks its flags before any server starts (issue:
reliability v3): a bad number, a missing model or profile folder, a --target the grid does not
serve, an --out it cannot create: one line naming the flag, exit 2, and the server binary (a
stand-in that leaves a mark when run) never started."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specsim.cli import main


@pytest.fixture
def fake_server(tmp_path, monkeypatch) -> Path:
    """A llama-server stand-in: it leaves ``STARTED`` beside itself and fails."""
    mark = tmp_path / "STARTED"
    exe = tmp_path / "llama-server"
    exe.write_text(f"#!/bin/sh\ntouch {mark}\nexit 1\n")
    exe.chmod(0o755)
    monkeypatch.setenv("SPECSIM_LLAMA_SERVER", str(exe))
    return mark


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv, says",
    [
        (["--temperatures", "nan"], "--temperatures"),
        (["--temperatures", "inf"], "--temperatures"),
        (["--temperatures", "1e308"], "--temperatures"),
        (["--calib-requests", "inf"], "--calib-requests"),
        (["--ctx-per-slot", "0"], "--ctx-per-slot"),
        (["--ctx-per-slot", "-5"], "--ctx-per-slot"),
        (["--max-tokens", "100000000"], "--max-tokens"),
        (["--ngram-n", "0"], "--ngram-n"),
        (["--parallel", "100000"], "--parallel"),
        (["--repeats", "1000000000"], "--repeats"),
        (["--min-requests", "10000000000"], "--min-requests"),
        (["--open-requests", "10000000000"], "--open-requests"),
        (["--rates", "1e-300"], "--rates"),
        (["--rates", "nan"], "--rates"),
        (["--seed", "-1"], "--seed"),
        (["--seed", "4294967295"], "--seed"),
        (["--specs", ","], "--specs"),
        (["--specs", "none,dspark:9"], "--specs"),
        (["--specs", "none,dspark:7:1"], "--specs"),
        (["--specs", "none,dspark:0"], "--specs"),
        (["--specs", "none,dspark:4", "--dspark-drafter", "nope"], "--dspark-drafter"),
        (["--profile", "/nonexistent/profiles"], "--profile"),
        (["--target", "/no/such/model.gguf"], "--target"),
        (["--out", "/proc/no/such/folder"], "--out"),
    ],
)
def test_bad_flags_are_refused_before_any_server_starts(argv, says, fake_server, tmp_path, capsys):
    out = ["--out", str(tmp_path / "report")] if "--out" not in argv else []
    code = main(["validate", "--engine", "llama-server", *out, *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and says in err[0], err
    assert "bug in specsim" not in err[0]
    assert not fake_server.exists()


def test_a_profile_folder_without_the_temperatures_profiles_is_refused(
    fake_server, tmp_path, capsys
):
    folder = tmp_path / "profiles"
    folder.mkdir()
    (folder / "profile-t0.csv").write_text("batch_tokens,step_ms\n1,1\n")
    code = main(["validate", "--engine", "llama-server", "--out", str(tmp_path / "r"),
                 "--profile", str(folder)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "profile-t1.csv" in err and not fake_server.exists()


def test_a_missing_model_file_is_one_line_before_any_server(
    fake_server, tmp_path, monkeypatch, capsys
):
    import specsim.record.models as models

    monkeypatch.setattr(models, "_SMOLLM2_FILE", "no-such-model.gguf")
    code = main(["validate", "--engine", "llama-server", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "no-such-model.gguf" in err[0], err
    assert not fake_server.exists()
    assert not os.path.exists(tmp_path / "r")  # nothing written either


def test_a_dspark_grid_without_the_converter_is_one_line_before_any_server(
    fake_server, tmp_path, monkeypatch, capsys
):
    """draft-dspark settings need llama.cpp's converter (their GGUF) and torch (their traces):
    checked before the first server, not minutes into the grid."""
    monkeypatch.setenv("SPECSIM_LLAMA_CPP_HOME", str(tmp_path / "nowhere"))
    code = main(["validate", "--engine", "llama-server", "--out", str(tmp_path / "r"),
                 "--specs", "none,dspark:4"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "llama.cpp's source tree" in err[0], err
    assert not fake_server.exists()
