"""Trace statistics on a hand-built trace, against numbers worked out by hand (in comments)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from specsim.cli import main
from specsim.trace.io import read_trace, write_trace
from specsim.trace.stats import auroc, ece, per_position_table, replay_full, trace_stats

# Request "A" (output_len 5) and "B" (output_len 2), gamma = 3.
ACCEPT = [2, 0, 1, 3, 0, 3, 1]
CONF = [
    [0.9, 0.9, 0.95],  # A0: k1 +, k2 +, k3 -
    [0.2, 0.3, 0.3],  # A1: k1 -
    [0.5, 0.2, 0.3],  # A2: k1 +, k2 -
    [0.9, 0.9, 0.9],  # A3: k1 +, k2 +, k3 +
    [0.2, 0.3, 0.3],  # A4: k1 -
    [0.9, 0.9, 0.9],  # B0: k1 +, k2 +, k3 +
    [0.9, 0.5, 0.3],  # B1: k1 +, k2 -
]


@pytest.fixture
def hand_trace(tmp_path):
    frame = pd.DataFrame(
        {
            "request_id": ["A"] * 5 + ["B"] * 2,
            "position": [0, 1, 2, 3, 4, 0, 1],
            "prompt_len": [9] * 5 + [4] * 2,
            "output_len": [5] * 5 + [2] * 2,
            "draft_tokens": [[1, 2, 3]] * 7,
            "confidence": CONF,
            "accept_len": ACCEPT,
            "category": ["x"] * 5 + ["y"] * 2,
        }
    )
    return read_trace(write_trace(frame, tmp_path / "hand.parquet", {"source": "recorded"}))


def test_replay_walk(hand_trace):
    rows, steps = replay_full(hand_trace)
    # A: n=0 accepts 2 -> +3 -> n=3 accepts 3 -> +min(4, 5-3)=2 -> done; B: n=0 -> +min(4, 2).
    assert rows.tolist() == [0, 3, 5]
    assert steps.tolist() == [2, 1]


def test_headline_numbers(hand_trace):
    s = trace_stats(hand_trace)
    assert (s["requests"], s["rows"], s["tokens"], s["gamma"]) == (2, 7, 7, 3)
    assert s["tau_replay"] == pytest.approx((3 + 4 + 4) / 3)  # accept_len + 1 at rows 0, 3, 5
    assert s["tokens_per_step"] == pytest.approx(7 / 3)
    assert s["replay_steps"] == 3
    assert s["tau_rows"] == pytest.approx(1 + 10 / 7)
    # k=1: 5 of 7 accepted; k=2: 3 of the 5 at risk; k=3: 2 of the 3 at risk.
    assert s["accept_rate"] == pytest.approx([5 / 7, 3 / 5, 2 / 3])
    # 10 positives (9 at 0.9, one at 0.5), 5 negatives (three at 0.2, one 0.5, one 0.95):
    # pairs won = 3*10 + 9 + 0.5 (tie) + 0 = 39.5 of 50.
    assert s["conf_auroc"] == pytest.approx(39.5 / 50)
    # Bins: 0.2 (3 neg) |0.6-0| + 0.5 (1 pos, 1 neg) |1.0-1| + 0.9 (9 pos) |8.1-9| + 0.95 (1 neg)
    # |0.95-0|, over 15 samples.
    assert s["conf_ece"] == pytest.approx((0.6 + 0.0 + 0.9 + 0.95) / 15, rel=1e-6)
    # Per category: A visits rows 0 and 3 (tau (3+4)/2), B row 0 (tau 4).
    assert s["categories"]["x"]["tau_replay"] == pytest.approx(3.5)
    assert s["categories"]["y"]["tau_replay"] == pytest.approx(4.0)
    assert s["categories"]["x"]["accept_rate"] == pytest.approx([3 / 5, 2 / 3, 1 / 2])
    assert s["categories"]["y"]["tokens"] == 2


def test_per_position_table(hand_trace):
    t = per_position_table(hand_trace)
    assert t["k"].tolist() == [1, 2, 3]
    assert t["n"].tolist() == [7, 5, 3]
    assert t["accepted"].tolist() == [5, 3, 2]
    assert t["mean_conf"].to_numpy() == pytest.approx([4.5 / 7, 3.4 / 5, 2.75 / 3], rel=1e-6)
    assert t["survival_rate"].to_numpy() == pytest.approx([5 / 7, 3 / 7, 2 / 7])
    a = np.cumprod(np.array(CONF, dtype=np.float32).astype(np.float64), axis=1)
    assert t["survival_mean"].to_numpy() == pytest.approx(a.mean(axis=0))


def test_survival_metrics_match_direct_definitions(hand_trace):
    s = trace_stats(hand_trace)
    a = np.cumprod(np.array(CONF, dtype=np.float32).astype(np.float64), axis=1).ravel()
    y = (np.array(ACCEPT)[:, None] >= np.arange(1, 4)).ravel()
    pos, neg = a[y], a[~y]
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    assert s["survival_auroc"] == pytest.approx(wins / (len(pos) * len(neg)))
    bins = np.minimum((a * 15).astype(int), 14)
    direct = sum(abs(a[bins == b].sum() - y[bins == b].sum()) for b in range(15)) / a.size
    assert s["survival_ece"] == pytest.approx(direct)


def test_auroc_and_ece_against_pairwise_counting():
    rng = np.random.default_rng(11)
    score = np.round(rng.random(300), 1)  # many ties
    label = rng.random(300) < score
    pos, neg = score[label], score[~label]
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    assert auroc(score, label) == pytest.approx(wins / (pos.size * neg.size))
    assert np.isnan(auroc(score, np.ones(300, dtype=bool)))
    perfect = np.array([0.0, 0.0, 1.0, 1.0])
    assert ece(perfect, perfect.astype(bool)) == 0.0
    assert ece(np.array([0.7, 0.7]), np.array([True, False])) == pytest.approx(0.2)


def test_info_command_text_and_json(hand_trace, capsys):
    assert main(["traces", "info", hand_trace.path]) == 0
    text = capsys.readouterr().out
    assert "requests   2   rows 7   tokens 7   block size 3" in text
    assert "tau_replay       3.667 tokens/step   95% CI [3.500, 4.000]   full-verification" in text
    assert "AUROC 0.790" in text
    assert "x                        1          5   3.50" in text
    assert main(["traces", "info", hand_trace.path, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["requests"] == 2 and data["gamma"] == 3
    assert data["conf_auroc"] == pytest.approx(0.79)
    assert data["meta"]["source"] == "recorded"
    assert [r["n"] for r in data["per_position"]] == [7, 5, 3]
    assert set(data["categories"]) == {"x", "y"}


def test_tau_interval_resamples_requests_and_holds_the_point_estimate(hand_trace):
    from specsim.trace.stats import tau_interval

    trace = hand_trace
    # A visits A0 (2+1), A3 (3+1): 7 over 2; B visits B0 (3+1): 4 over 1 -> tau = 11 / 3
    lo, hi = tau_interval(trace)
    assert lo <= 11 / 3 <= hi
    # resampling whole requests: every bootstrap draw is A-only (3.5), B-only (4) or a mix
    assert lo >= 3.5 - 1e-12 and hi <= 4.0 + 1e-12
    assert tau_interval(trace) == (lo, hi)  # fixed seed: same trace, same interval
    assert trace_stats(trace)["tau_ci95"] == [lo, hi]


def test_tau_interval_narrows_with_more_requests():
    from specsim.trace.stats import tau_interval
    from specsim.trace.synth import synth_trace

    def width(n: int) -> float:
        lo, hi = tau_interval(synth_trace(n_requests=n, accept_profile=[0.7] * 5, seed=1))
        return hi - lo

    assert width(400) < width(25)
