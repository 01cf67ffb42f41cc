"""scripts/replay_logged_slots.py on a committed grid (held-out-3's plain server): the slots
its info-level log names, the runs replayed with them, and a log that is not the grid's
refused."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from specsim.errors import SpecsimError

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
REPORT = ROOT / "reports" / "llama-cpp-v4" / "held-out-3"


def test_the_log_names_a_slot_for_every_request_of_the_runs():
    import pandas as pd
    import replay_logged_slots as r

    slots = r.logged_slots(REPORT / "logs" / "server-none.log")
    runs = pd.read_csv(REPORT / "runs.csv")
    assert len(slots) == runs.loc[runs["spec"] == "none", "requests"].sum()
    assert set(slots) <= set(range(8)) and len(set(slots)) == 8


def test_a_busy_logged_slot_falls_back_to_the_lowest_free_one():
    import replay_logged_slots as r

    rule = r.LoggedSlots([3, 3, 9])
    busy = np.zeros(8, dtype=bool)
    assert rule.choose(busy, 0) == 3
    busy[3] = True
    assert rule.choose(busy, 1) == 0 and rule.choose(busy, 2) == 0
    assert rule.fallbacks == 2


@pytest.mark.slow
def test_the_plain_server_replayed_in_its_own_slots_is_slower_than_in_the_lowest():
    """held-out-3's plain server at C = 6: the lowest free slots run its requests in fewer
    passes than the server's own layout (PLAN.md step 9)."""
    import replay_logged_slots as r

    table = r.replay_runs(REPORT, specs=("none",))
    assert set(table["spec"]) == {"none"} and len(table) == 20
    cells = r.cell_errors(table)
    closed = cells[cells["concurrency"] == 6]
    assert (closed["logged_tpot_ms_mean"] > 1.1 * closed["lowest_tpot_ms_mean"]).all()
    assert table["fallbacks"].sum() < 0.2 * table["requests"].sum()


def test_a_log_that_is_not_the_grids_is_refused(tmp_path):
    import replay_logged_slots as r

    copy = tmp_path / "h3"
    shutil.copytree(REPORT, copy, ignore=shutil.ignore_patterns("traces", "*.parquet"))
    log = copy / "logs" / "server-none.log"
    log.write_text(log.read_text().split("launch_slot_", 2)[0])
    with pytest.raises(SpecsimError, match="not this grid's log"):
        r.replay_runs(copy, specs=("none",))
    assert r.main([str(tmp_path / "nowhere")]) == 2


@pytest.mark.slow
def test_a_grid_of_per_run_draws_is_replayed_on_each_runs_own_draw(monkeypatch):
    """held-out-6 sent run i of a cell the jobs of seed i (--arrival-seeds per-run): each kept
    run is replayed on its own draw, with the logged and with the lowest free slots."""
    import replay_logged_slots as r

    from specsim.fidelity.llama import grid

    seen: list[int | None] = []
    real = grid.simulate_cell

    def spy(*a, seed=None, **k):  # noqa: ANN002, ANN003
        seen.append(seed)
        return real(*a, seed=seed, **k)

    monkeypatch.setattr(grid, "simulate_cell", spy)
    report = ROOT / "reports" / "llama-cpp-v4" / "held-out-6"
    table = r.replay_runs(report, specs=("none",))
    assert len(table) == 20 and sorted(set(table["arrival_seed"])) == [1, 2, 3, 4, 5]
    assert seen == [s for s in table["arrival_seed"] for _ in range(2)]
    open_loop = table[table["rate"].notna() & (table["temperature"] == 0)]
    assert open_loop["lowest_tpot_ms_mean"].nunique() == 5  # five draws, five simulated runs
