"""``replay --spread``: a run's headlines beside their span over other profiles (issue 63,
item 4: what a built profile's assumptions move, shown where the user reads the number)."""

from __future__ import annotations

import json

import pytest

from specsim.cli import main


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("spread")
    out = {}
    for pt in ("mid", "low", "high"):
        out[pt] = d / f"p-{pt}.csv"
        assert main(["profile", "build", "--model", "llama-3-8b", "--drafter", "mtp:3",
                     "--assume", pt, "--out", str(out[pt])]) == 0  # fmt: skip
    return out


def _replay(built, *extra: str) -> list[str]:
    return ["replay", "chat", "--policy", "static:3", "--concurrency", "8", "--requests", "80",
            "--profile", str(built["mid"]), *extra]  # fmt: skip


def test_the_span_over_the_low_and_high_builds_holds_the_mid_run(built, capsys):
    spread = f"{built['low']},{built['high']}"
    assert main(_replay(built, "--spread", spread, "--json")) == 0
    res = json.loads(capsys.readouterr().out)
    lo, hi = (res["spread"][str(built[pt])]["throughput_tok_s"] for pt in ("high", "low"))
    assert lo < res["throughput_tok_s"] < hi  # the high end is the dearer profile
    assert main(_replay(built, "--spread", spread)) == 0
    text = capsys.readouterr().out
    line = [ln for ln in text.splitlines() if ln.startswith("Output token throughput")][-1]
    assert f"({lo:,.0f} - {hi:,.0f})" in line
    assert "Spread over 2 profiles" in text


def test_a_run_without_spread_prints_none(built, capsys):
    assert main(_replay(built)) == 0
    assert "Spread over" not in capsys.readouterr().out


@pytest.mark.parametrize("spread, why", [("", "--spread is empty"),
                                         ("a.csv,,b.csv", "empty item"),
                                         ("/nonexistent/p.csv", "p.csv")])  # fmt: skip
def test_a_bad_spread_is_one_line_and_exit_2(built, capsys, spread, why):
    assert main(_replay(built, "--spread", spread)) == 2
    err = capsys.readouterr().err.strip()
    assert why in err and len(err.splitlines()) == 1 and "Traceback" not in err
