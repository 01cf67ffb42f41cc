"""Serving model v1 is retired (issue 65, item 2): one serving model. A saved command, config or
script that asks for v1 gets one line naming the commit that still runs it (exit 2 on the
command line, a SpecsimError from the API), and ``replay --help`` offers v2 only."""

from __future__ import annotations

from pathlib import Path

import pytest

from specsim.cli import main
from specsim.errors import SpecsimError
from specsim.sim.config import V1_COMMIT, V1_RETIRED
from specsim.sim.simulate import replay

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "extra",
    [
        ["--serving", "v1"],
        ["--serving", "v1", "--max-running", "8", "--policy", "zos"],
        ["--serving=v1", "--out", "never.parquet"],
    ],
)
def test_the_command_refuses_v1_in_one_line(extra, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = main(["replay", "chat", "--concurrency", "8", "--requests", "64", *extra])
    cap = capsys.readouterr()
    assert code == 2 and cap.out == ""
    assert cap.err.splitlines() == [f"specsim: error: {V1_RETIRED}"], cap.err
    assert f"commit {V1_COMMIT}" in cap.err and "Traceback" not in cap.err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_another_serving_model_is_one_line_too(capsys):
    assert main(["replay", "chat", "--concurrency", "2", "--serving", "v3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--serving must be v2" in err


@pytest.mark.parametrize("options", [{"serving": "v1"}, {"prefill_budget": 4096}])
def test_the_api_raises_the_same_line(options):
    with pytest.raises(SpecsimError) as exc:
        replay("chat", "mtp1", concurrency=2, requests=6, **options)
    assert str(exc.value) == V1_RETIRED


def test_v2_is_still_accepted_by_name():
    s = replay("chat", "mtp1", concurrency=2, requests=6, serving="v2", record_tokens=False)
    assert s.config["serving"] == "v2" and s.summary["requests_completed"] == 6


def test_help_offers_one_serving_model(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["replay", "--help"])
    assert exc.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--serving v2" in out and f"v1 was retired, it runs at commit {V1_COMMIT}" in out
    assert "--prefill-budget" not in out
    assert "{v2,v1}" not in out and "v1 (the earlier model" not in out


def test_the_v1_engine_is_gone():
    """Its loop, its walks, its 2-D step table and its profile forms are not in the package."""
    assert not (ROOT / "specsim" / "sim" / "engine.py").exists()
    text = "".join(p.read_text() for p in (ROOT / "specsim").rglob("*.py"))
    for gone in ("StepV1", "_solo_stretch", "_rowwise_stretch", "for_serving", "Step2D"):
        assert gone not in text, gone
