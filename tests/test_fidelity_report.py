"""The fidelity page's torch-free parts: which cells miss the goal and which term differs."""

from __future__ import annotations

import pandas as pd

from specsim.fidelity.tables import (
    machine_verdict,
    misses_markdown,
    ttft_misses_markdown,
    ttft_parts,
)


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


def _requests(cell, side, queued_ms, prefill_ms, repeat=0):
    """A cell's requests arriving 1 s apart, each queued and prefilled as given (ms)."""
    rows = []
    for i, (q, p) in enumerate(zip(queued_ms, prefill_ms, strict=True)):
        a = float(i)
        rows.append(
            {"drafter": "dspark", "policy": cell, "load": "rate=0.9x", "side": side,
             "repeat": repeat, "id": i, "prompt_len": 100, "arrival_s": a,
             "admitted_s": a + q / 1000, "first_token_s": a + (q + p) / 1000,
             "ttft_ms": q + p}
        )  # fmt: skip
    return rows


def test_ttft_parts_are_medians_of_queued_and_prefill():
    parts = ttft_parts(pd.DataFrame(_requests("ar", "real", [0, 10, 50], [300, 320, 310])))
    assert parts["n"] == 3
    assert abs(parts["queued_ms"] - 10) < 1e-9 and abs(parts["prefill_ms"] - 310) < 1e-9
    assert abs(parts["ttft_ms"] - 330) < 1e-9


def test_a_ttft_miss_names_the_part_that_differs(tmp_path):
    table = pd.DataFrame(
        [{"drafter": "dspark", "policy": p, "load": "rate=0.9x", "err_ttft_ms_p50": e,
          "spread_ttft_ms_p50": sp}
         for p, e, sp in (("full", 0.40, 0.1), ("zos", -0.15, 0.2), ("ar", 0.05, 0.0))]
    )  # fmt: skip
    rows = (
        # full: the simulation queues 120 ms longer, prefills alike -> queued
        _requests("full", "real", [0, 20, 40], [300, 300, 300])
        + _requests("full", "real", [0, 20, 40], [300, 300, 300], repeat=1)
        + _requests("full", "sim", [0, 140, 200], [305, 305, 305], repeat=-1)
        # zos: queued alike, the simulation prefills 50 ms shorter -> prefill
        + _requests("zos", "real", [0, 0, 0], [350, 350, 350])
        + _requests("zos", "sim", [0, 0, 0], [300, 300, 300], repeat=-1)
        + _requests("ar", "real", [0, 0, 0], [300, 300, 300])
        + _requests("ar", "sim", [0, 0, 0], [300, 300, 300], repeat=-1)
    )
    pd.DataFrame(rows).to_parquet(tmp_path / "requests.parquet")
    text = ttft_misses_markdown(table, tmp_path / "requests.parquet")
    lines = [r for r in text.splitlines() if r.startswith("| dspark")]
    assert len(lines) == 2  # ar meets the goal
    assert "| 6 / 3 |" in lines[0] and "queued: sim +120.0 ms (+37.5% of the real TTFT)" in lines[0]
    assert "| 10.0% |" in lines[0]  # outside its repeats' spread
    assert "prefill: sim -50.0 ms" in lines[1] and "| 20.0% (inside) |" in lines[1]
    assert "1 of these 2 misses are inside" in text


def test_no_ttft_section_without_timelines(tmp_path):
    table = pd.DataFrame(
        [{"drafter": "dspark", "policy": "ar", "load": "C=1", "err_ttft_ms_p50": 0.3}]
    )
    assert ttft_misses_markdown(table, tmp_path / "requests.parquet") == ""
