"""``tune --spread``: the recommended setting's gain over no speculation on other profiles (the
same seeds), e.g. a built profile's --assume against and favour corners (issue 63, item 4)."""

from __future__ import annotations

import json

import pytest

from specsim.cli import main


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("tspread")
    out = {}
    for pt in ("mid", "against", "favour"):
        out[pt] = d / f"p-{pt}.csv"
        argv = ["profile", "build", "--model", "llama-3-8b", "--drafter",
                "dspark:layers=5,block=7", "--assume", pt, "--out", str(out[pt])]  # fmt: skip
        assert main(argv) == 0
    return out


def _tune(built, *extra: str) -> list[str]:
    return ["tune", "synthetic-chat", "--engine", "vllm", "--concurrency", "4",
            "--requests", "100", "--seeds", "2", "--draft-lens", "3,7", "--profile",
            str(built["mid"]), *extra]  # fmt: skip


@pytest.mark.slow
def test_the_corners_bracket_the_recommended_gain(built, capsys):
    spread = f"{built['against']},{built['favour']}"
    assert main(_tune(built, "--spread", spread, "--json")) == 0
    res = json.loads(capsys.readouterr().out)
    rows = res["spread"]
    assert [r["profile"] for r in rows][1:] == [str(built["against"]), str(built["favour"])]
    mid, against, favour = (r["gain"] for r in rows)
    assert against < mid < favour
    assert res["config"]["spread"] == [str(built["against"]), str(built["favour"])]
    assert main(_tune(built, "--spread", spread)) == 0
    text = capsys.readouterr().out
    assert "spread (--spread" in text and f"{100 * against:+.1f}% to {100 * favour:+.1f}%" in text


@pytest.mark.parametrize("spread, why", [("", "--spread is empty"),
                                         ("/nonexistent/p.csv", "p.csv")])  # fmt: skip
def test_a_bad_spread_is_refused_before_the_search(built, capsys, spread, why):
    assert main(_tune(built, "--spread", spread)) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert why in err[-1] and "Traceback" not in captured.err
    assert "tune" not in captured.out  # nothing searched
