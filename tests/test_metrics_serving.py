"""The serving metrics a vLLM / SGLang user expects, computed from a real replay."""

from __future__ import annotations

import numpy as np
import pytest

from specsim.errors import SpecsimError
from specsim.sim.metrics import _weighted_pct, parse_slo
from specsim.sim.simulate import replay

TRACE = "traces/synthetic-chat.parquet"


def test_weighted_percentile_is_numpy_on_the_expanded_sample():
    rng = np.random.default_rng(0)
    for _ in range(300):
        x, w = rng.random(9), rng.integers(0, 5, 9)
        if w.sum() == 0:
            continue
        for q in (0, 50, 90, 95, 99, 100):
            assert _weighted_pct(x, w, q) == pytest.approx(np.percentile(np.repeat(x, w), q))


def test_percentiles_are_ordered_and_match_the_request_table():
    res = replay(TRACE, "mtp1", concurrency=8, requests=120, seed=1)
    s, req = res.summary, res.requests
    for name in ("ttft", "tpot", "e2e", "itl"):
        p = [s[f"{name}_ms_p{q}"] for q in (50, 90, 95, 99)]
        assert all(np.isfinite(p)) and p == sorted(p), name
    done = req[np.isfinite(req["finish_s"])]
    e2e = (done["finish_s"] - done["arrival_s"]).to_numpy() * 1000.0
    assert s["e2e_ms_p90"] == pytest.approx(np.percentile(e2e, 90))
    assert s["ttft_ms_p95"] == pytest.approx(np.percentile(done["ttft_ms"].dropna(), 95))
    assert s["request_throughput"] == pytest.approx(len(done) / s["sim_time_s"])
    # one chunk per decode step: ITL is at least a step and its mean is a step period
    assert s["itl_ms_p50"] >= s["tpot_ms_p50"] * 0.99


def test_goodput_counts_requests_meeting_every_slo():
    loose = replay(TRACE, "mtp1", concurrency=4, requests=60, slo="ttft=1e6,tpot=1e6").summary
    assert loose["slo_attainment"] == 1.0
    assert loose["goodput_req_s"] == pytest.approx(loose["request_throughput"])
    tight = replay(TRACE, "mtp1", concurrency=4, requests=60, slo="ttft=1e-6").summary
    assert tight["goodput_req_s"] == 0.0 and tight["slo_attainment"] == 0.0
    none = replay(TRACE, "mtp1", concurrency=4, requests=60).summary
    assert np.isnan(none["goodput_req_s"])


@pytest.mark.parametrize("text", ["ttft", "ttft=-1", "ttft=nan", "foo=3", "ttft=abc"])
def test_bad_slo_is_one_line(text):
    with pytest.raises(SpecsimError, match="--slo"):
        parse_slo(text)


def test_slo_parses():
    assert parse_slo("ttft=200, tpot=50") == {"ttft": 200.0, "tpot": 50.0}
    assert parse_slo(None) is None


def test_closed_loop_holds_its_concurrency_in_the_steady_window():
    res = replay(TRACE, "mtp1", concurrency=16, requests=48, profile="v4-flash-8xh20")
    s = res.summary
    assert s["achieved_concurrency"] == pytest.approx(16.0, rel=1e-9)
    assert s["steady_window_s"] > 0 and np.isfinite(s["steady_throughput_tok_s"])
    # whole-run mean in system is lower: warm-up is synchronised and the drain runs alone
    assert s["mean_in_system"] < 16.0


def test_closed_loop_without_a_window_reports_nan():
    s = replay(TRACE, "mtp1", concurrency=64, requests=64).summary
    assert np.isnan(s["steady_throughput_tok_s"]) and np.isnan(s["achieved_concurrency"])


def test_replay_cli_refuses_a_closed_loop_it_cannot_hold(capsys):
    from specsim.cli import main

    assert main(["replay", "traces/chat.parquet", "--concurrency", "256"]) == 2
    err = capsys.readouterr().err
    assert "--requests 768" in err and err.count("\n") == 1
    assert main(["sweep", "traces/chat.parquet", "--policies", "mtp1", "--concurrency",
                 "1,64", "--out", "unused.parquet"]) == 2  # fmt: skip
    assert "--requests 192" in capsys.readouterr().err
