"""Progress off a terminal: periodic lines in a log, nothing from a short run."""

from __future__ import annotations

import subprocess
import sys

from specsim.progress import Progress


def test_a_log_gets_periodic_lines_and_a_last_one(monkeypatch, capsys):
    monkeypatch.delenv("SPECSIM_PROGRESS", raising=False)
    monkeypatch.setenv("SPECSIM_PROGRESS_EVERY", "1e-9")  # a line at every update
    with Progress(4, "sweep", " cells") as bar:
        for _ in range(4):
            bar.update(1)
            bar.note("2 cached")
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("specsim: sweep 1/4 cells (25%)") and "ETA" in lines[0]
    assert "[2 cached]" in lines[1]
    assert lines[-1].endswith(", done") and "4/4 cells (100%)" in lines[-1]


def test_a_short_run_prints_nothing_to_a_log(monkeypatch, capsys):
    monkeypatch.delenv("SPECSIM_PROGRESS", raising=False)
    monkeypatch.delenv("SPECSIM_PROGRESS_EVERY", raising=False)  # 30 s
    with Progress(1000, "replay", " req") as bar:
        for _ in range(1000):
            bar.update(1)
    assert capsys.readouterr().err == ""


def test_zero_silences_and_an_unknown_total_has_no_eta(monkeypatch, capsys):
    monkeypatch.setenv("SPECSIM_PROGRESS_EVERY", "1e-9")
    monkeypatch.setenv("SPECSIM_PROGRESS", "0")
    with Progress(3, "x") as bar:
        bar.update(3)
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("SPECSIM_PROGRESS", "lines")
    with Progress(0, "bench", " req") as bar:
        bar.update(5)
    err = capsys.readouterr().err
    assert "specsim: bench 5 req, " in err and "ETA" not in err and "%" not in err


def test_a_cli_run_logs_progress_through_a_pipe(tmp_path):
    """The sweep command, stderr a pipe as under nohup: progress lines, and stdout untouched."""
    out = tmp_path / "runs.parquet"
    env = {"SPECSIM_PROGRESS_EVERY": "1e-9", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-m", "specsim.cli", "sweep", "traces/synthetic-chat.parquet",
         "--policies", "mtp1,zos", "--concurrency", "1,2", "--requests", "8",
         "--workers", "1", "--out", str(out)],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    progress = [ln for ln in proc.stderr.splitlines() if ln.startswith("specsim: sweep")]
    assert progress and progress[-1].endswith(", done"), proc.stderr
    assert "specsim: sweep" not in proc.stdout
