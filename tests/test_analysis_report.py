"""``specsim report NAME`` end to end on small configs: the folder gets a README with tables,
figures and the command, results are reusable on request, and config mistakes are one line."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from specsim.analysis.report import markdown_table, run_report
from specsim.cli import main
from specsim.errors import SpecsimError
from specsim.trace.io import write_trace
from specsim.trace.synth import synth_trace

SUL = """
kind = "schedulers-under-load"
title = "Small"
traces = [["../../traces/absent.parquet", "../../traces/small.parquet"]]
policies = ["mtp1", "hw-aware", "hw-aware-global", "zos"]
profile = "v4-flash-8xh20"
concurrency = [1, 4, 16]
requests = 40
requests_per_concurrency = 3
sla_targets = [40, 200]
sla_policies = ["hw-aware-global", "zos"]
"""

ZOS = """
kind = "zos"
trace = "../../traces/small.parquet"
sched_scales = [0, 300]
concurrency = [16]
requests = 40
"""


@pytest.fixture()
def root(tmp_path) -> Path:
    (tmp_path / "traces").mkdir()
    t = synth_trace(n_requests=50, accept_profile=[0.85, 0.8, 0.75, 0.7, 0.7], seed=2)
    write_trace(t, tmp_path / "traces" / "small.parquet")
    (tmp_path / "reports" / "sul").mkdir(parents=True)
    (tmp_path / "reports" / "sul" / "config.toml").write_text(SUL)
    (tmp_path / "reports" / "z").mkdir()
    (tmp_path / "reports" / "z" / "config.toml").write_text(ZOS)
    return tmp_path / "reports"


def _images(readme: Path) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\(([^)]+)\)", readme.read_text())


@pytest.mark.slow  # fast suite under 5 min: over 2.8 s alone (CI runs it)
def test_schedulers_under_load_report(root, monkeypatch):
    monkeypatch.chdir(root.parent)
    readme = run_report("sul", root, workers=1)
    text = readme.read_text()
    for heading in (
        "# Small",
        "## Traces",
        "## Throughput at SLA targets",
        "## Against the paper's production figures",
        "## How this was made",
    ):
        assert heading in text
    assert "```\nspecsim report sul\n```" in text  # the exact command, from this cwd
    assert "traces/small.parquet" in text  # the fallback candidate was used
    imgs = _images(readme)
    assert {"pareto.png", "sla.png", "load.png", "calibration-small.png"} <= set(imgs)
    for img in imgs:
        data = (readme.parent / img).read_bytes()
        assert data[:4] == b"\x89PNG" and len(data) > 20_000
    table = pd.read_parquet(readme.parent / "results.parquet")
    assert len(table) == 4 * 3 and set(table["policy"]) == {
        "mtp1",
        "hw-aware",
        "hw-aware-global",
        "zos",
    }
    assert "| zos |" in text or "zos tok/s" in text
    assert "numpy" in text and "git" in text  # versions recorded


@pytest.mark.slow  # fast suite under 5 min: over 2.8 s alone (CI runs it)
def test_report_resume_reuses_rows_only_when_asked(root, monkeypatch):
    monkeypatch.chdir(root.parent)
    run_report("sul", root, workers=1)
    first = pd.read_parquet(root / "sul" / "results.parquet")
    readme = run_report("sul", root, workers=1, resume=True)
    assert "12 of 12 sweep cells were reused" in readme.read_text()
    again = pd.read_parquet(root / "sul" / "results.parquet")
    pd.testing.assert_frame_equal(
        first.drop(columns="wall_time_s"), again.drop(columns="wall_time_s")
    )
    readme = run_report("sul", root, workers=1)  # default: recompute everything
    assert "were reused" not in readme.read_text()


@pytest.mark.slow
def test_zos_report(root, monkeypatch):
    monkeypatch.chdir(root.parent)
    readme = run_report("z", root, workers=1)
    text = readme.read_text()
    assert "zos.png" in _images(readme)
    assert "overlap buys" in text and "lag costs" in text
    table = pd.read_parquet(root / "z" / "results.parquet")
    assert set(table["profile"]) == {"v4-flash-8xh20@sched-x0", "v4-flash-8xh20@sched-x300"}

    # at 300x the scheduler's cost, overlapping it must beat running it serially
    def tput(policy, profile):
        rows = table[(table["policy"] == policy) & (table["profile"] == profile)]
        return rows["throughput_tok_s"].mean()

    serial = tput("specsim.analysis.variants:zos_serial", "v4-flash-8xh20@sched-x300")
    overlapped = tput("zos", "v4-flash-8xh20@sched-x300")
    assert overlapped > 1.05 * serial
    # and at zero cost they are the same schedule: identical throughput
    assert tput("zos", "v4-flash-8xh20@sched-x0") == tput(
        "specsim.analysis.variants:zos_serial", "v4-flash-8xh20@sched-x0"
    )


@pytest.mark.slow
def test_lossless_report_small(root, monkeypatch):
    monkeypatch.chdir(root.parent)
    d = root / "ll"
    d.mkdir()
    (d / "config.toml").write_text(
        'kind = "lossless"\nsamples = 3000\npolicies = ["hw-aware", "hw-aware-global", "oracle"]\n'
        'mutants = ["always-accept"]\n'
    )
    text = run_report("ll", root).read_text()
    rows = {
        cells[2]: cells
        for line in text.splitlines()
        if line.startswith("| ")
        for cells in [[c.strip() for c in line.split("|")]]
    }
    assert "lossless" in rows["hw-aware"] and "yes" in rows["hw-aware"]
    assert "LOSSY" in rows["hw-aware-global"] and "yes" in rows["hw-aware-global"]
    assert "not checkable" in rows["oracle"]
    assert "LOSSY" in rows["typical acceptance (Medusa)"]
    assert "lossless" in rows["rejection sampling"]
    assert "1 of 1 mutants are caught" in text


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ('kind = "nope"\n', "unknown kind 'nope'"),
        ('kind = "zos"\n', "has no 'trace'"),
        ('kind = "zos"\ntrace = "missing.parquet"\n', "none of ['missing.parquet'] exists"),
        ('kind = "schedulers-under-load"\ntraces = "x"\n', "'traces' must be list"),
        ("kind = [\n", "not valid TOML"),
    ],
)
def test_config_errors_are_one_line(root, config, needle):
    d = root / "bad"
    d.mkdir()
    (d / "config.toml").write_text(config)
    with pytest.raises(SpecsimError) as exc:
        run_report("bad", root)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_cli_lists_reports_and_rejects_unknown_names(root, capsys):
    assert main(["report", "--root", str(root)]) == 0
    assert capsys.readouterr().out.split() == ["sul", "z"]
    assert main(["report", "nope", "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert "known reports: sul, z" in err and err.count("\n") == 1


def test_markdown_table():
    df = pd.DataFrame({"a": ["x|y", "z"], "b": [1.23456, float("nan")]})
    lines = markdown_table(df, "{:.2f}").splitlines()
    cells = [[c.strip() for c in line.strip("|").split(" | ")] for line in lines]
    assert cells[0] == ["a", "b"] and set(lines[1]) <= set("|-:")
    assert cells[2:] == [["x\\|y", "1.23"], ["z", "n/a"]]
