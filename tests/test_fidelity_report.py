"""The fidelity page's torch-free parts: which cells miss the goal and which term differs."""

from __future__ import annotations

import pandas as pd

from specsim.analysis.fidelity_report import machine_verdict, misses_markdown


def _table(errs):
    return pd.DataFrame(
        [
            {"drafter": "dspark", "policy": p, "load": "C=4", "err_throughput_tok_s": e,
             "err_tpot_ms_mean": -e, "spread_throughput_tok_s": 0.01}
            for p, e in errs
        ]
    )  # fmt: skip


def test_no_miss_no_section(tmp_path):
    assert misses_markdown(_table([("ar", 0.04), ("zos", -0.049)]), tmp_path / "none.csv") == ""


def test_a_miss_names_the_term_with_the_larger_gap(tmp_path):
    dec = pd.DataFrame(
        [
            # drafting 10 ms slower than modelled, verification within 1 ms: drafting
            {"drafter": "dspark", "policy": "ar", "load": "C=4", "real_draft_ms": 60.0,
             "model_draft_ms": 50.0, "real_forward_ms": 100.0, "real_loop_ms": 2.0,
             "model_table_ms": 90.0, "model_overhead_ms": 11.0, "real_step_ms": 162.0,
             "model_step_ms": 151.0},
            # verification (forward + loop against table + curve) 12 ms off: verification
            {"drafter": "dspark", "policy": "zos", "load": "C=4", "real_draft_ms": 50.0,
             "model_draft_ms": 51.0, "real_forward_ms": 120.0, "real_loop_ms": 3.0,
             "model_table_ms": 100.0, "model_overhead_ms": 11.0, "real_step_ms": 173.0,
             "model_step_ms": 162.0},
        ]
    )  # fmt: skip
    dec.to_csv(tmp_path / "decomposition.csv", index=False)
    text = misses_markdown(_table([("ar", 0.07), ("zos", -0.08), ("full", 0.01)]),
                           tmp_path / "decomposition.csv")  # fmt: skip
    rows = [r for r in text.splitlines() if r.startswith("| dspark")]
    assert len(rows) == 2  # "full" meets the goal
    assert "drafting: real +10.0 ms (+6.2% of the step)" in rows[0]
    assert "verification: real +12.0 ms" in rows[1] and "123.0 / 111.0" in rows[1]


def _spread_table(spreads, repeats=2):
    return pd.DataFrame(
        [
            {"concurrency": 4, "repeats": repeats, "spread_throughput_tok_s": s,
             "spread_tpot_ms_mean": s / 2}
            for s in spreads
        ]
        + [{"concurrency": 0, "repeats": 1, "spread_throughput_tok_s": 0.9,
            "spread_tpot_ms_mean": 0.9}]  # open loop: one run, not counted
    )  # fmt: skip


def test_machine_verdict_says_a_noisy_host_cannot_test_the_goal():
    text = machine_verdict(_spread_table([0.02, 0.12, 0.30]))
    assert "median 12.0% (worst 30.0%) over 3 closed-loop cells" in text
    assert "MORE than the 5% goal" in text and "--ref-every 1" in text


def test_machine_verdict_on_a_quiet_host_and_without_repeats():
    text = machine_verdict(_spread_table([0.01, 0.03, 0.08]))
    assert "median 3.0%" in text and "below the 5% goal, so the grid can test it" in text
    assert machine_verdict(_spread_table([0.5, 0.5], repeats=1)) == ""
