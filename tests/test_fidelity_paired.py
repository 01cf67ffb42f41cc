"""The paired score of a llama-server grid (specsim/fidelity/llama/paired.py): each kept run
against its own simulation on the run's seed, so what both sides share (the draw of arrivals)
leaves the interval while the machine's speed from run to run stays in it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from specsim.fidelity.llama.config import LlamaValidationConfig
from specsim.fidelity.llama.paired import paired_columns, section

REAL = [100.0, 130.0, 70.0, 115.0, 85.0]  # a wide real interval: the draws of arrivals


def _runs(real: list[float], seeds: bool = True) -> pd.DataFrame:
    base = {"spec": "none", "temperature": 0.0, "concurrency": np.nan, "rate": 1.0,
            "requests": 12, "ttft_ms_mean": 1.0, "e2e_ms_mean": 2.0,
            "steady_throughput_tok_s": 1.0, "server_drafted": 0, "server_accepted": 0,
            "outputs_as_trace": 1.0, "requests_counts_exact": 1.0}  # fmt: skip
    rows = [{**base, "warmup": True, "repeat": -1, "throughput_tok_s": 50.0,
             "tpot_ms_mean": 20.0, "arrival_seed": 0}]  # fmt: skip
    rows += [{**base, "warmup": False, "repeat": j, "throughput_tok_s": v,
              "tpot_ms_mean": 1000.0 / v, "arrival_seed": j + 1}
             for j, v in enumerate(real)]  # fmt: skip
    out = pd.DataFrame(rows)
    return out if seeds else out.drop(columns="arrival_seed")


def test_a_run_by_run_ratio_is_tight_where_the_real_level_is_not():
    runs = _runs(REAL).iloc[1:]
    sims = [{"throughput_tok_s": 1.02 * v, "tpot_ms_mean": 1000.0 / v} for v in REAL]
    got = paired_columns(runs, sims, 0.05)
    assert got["paired_err_throughput"] == pytest.approx(0.02)
    assert got["paired_ci_throughput"] == pytest.approx(0.0, abs=1e-9)
    assert got["paired_err_tpot_mean"] == pytest.approx(0.0, abs=1e-12)
    assert got["paired_tight"] is True
    shuffled = sims[1:] + sims[:1]  # a run scored against another run's simulation
    assert paired_columns(runs, shuffled, 0.05)["paired_tight"] is False
    with pytest.raises(ValueError, match="one simulated summary per run"):
        paired_columns(runs, sims[:2], 0.05)


def test_compare_pairs_each_kept_run_with_the_simulation_of_its_own_seed(monkeypatch):
    from specsim.fidelity.llama import grid

    by_seed = {j + 1: v for j, v in enumerate(REAL)} | {0: 50.0}

    def fake_sim(cfg, s, trace, cost, c, rate, slots=None, seed=None):
        # the simulator 3% fast on every run's own draw (the config's seed: one draw for all)
        v = 1.03 * by_seed[int(seed)] if seed is not None else 100.0
        return {"throughput_tok_s": v, "tpot_ms_mean": 1000.0 / v, "requests_completed": 12}

    monkeypatch.setattr(grid, "simulate_cell", fake_sim)
    cfg = LlamaValidationConfig(arrival_seeds="per-run", target_ci=0.05, specs=("none",))
    row = grid.compare(cfg, _runs(REAL), {("none", 0.0): None}, {(False, 0.0): None}).iloc[0]
    assert not bool(row["converged"])  # the real median's interval: the arrivals' spread
    assert row["paired_err_throughput"] == pytest.approx(0.03)
    assert row["paired_err_tpot_mean"] == pytest.approx(1 / 1.03 - 1)
    assert bool(row["paired_tight"])
    fixed = cfg.with_(arrival_seeds="fixed")
    plain = grid.compare(fixed, _runs(REAL, seeds=False), {("none", 0.0): None},
                         {(False, 0.0): None})  # fmt: skip
    assert "paired_tight" not in plain.columns  # one draw for every run: nothing to pair


def test_the_readmes_paired_section_counts_the_tight_cells():
    table = pd.DataFrame({
        "paired_err_throughput": [0.02, -0.10], "paired_err_tpot_mean": [-0.01, 0.30],
        "paired_spread_throughput": [0.04, 0.50], "paired_spread_tpot_mean": [0.02, 0.60],
        "paired_tight": [True, False],
    })  # fmt: skip
    text = section(table, 0.05)
    assert "within +-5% on both: **1 of 2**" in text
    assert "there, throughput median **2.0%**, worst 2.0%" in text
    assert "mean TPOT median **15.5%**, worst 30.0%" in text
    assert "no cell" in section(table.assign(paired_tight=False), 0.05)
