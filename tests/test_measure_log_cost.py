"""scripts/measure_log_cost.py: the calibration's runs on a server logging every step and on a
quiet one (a real llama-server, tiny), and its refusals."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))


def test_bad_input_is_refused_in_one_line(tmp_path, capsys):
    import measure_log_cost as m

    assert m.main([str(tmp_path / "none.json"), "--out", str(tmp_path / "o.csv")]) == 2
    assert "is not a file" in capsys.readouterr().err
    conf = tmp_path / "c.json"
    conf.write_text("{}")
    assert m.main([str(conf), "--cycles", "0", "--out", str(tmp_path / "o.csv")]) == 2
    (tmp_path / "o.csv").write_text("mine")
    assert m.main([str(conf), "--out", str(tmp_path / "o.csv")]) == 2  # not overwritten
    assert (tmp_path / "o.csv").read_text() == "mine"


@pytest.mark.slow
@pytest.mark.real_server
def test_one_cycle_runs_every_load_on_both_servers(tmp_path):
    import measure_log_cost as m

    from specsim.fidelity.llama.config import LlamaValidationConfig

    cfg = LlamaValidationConfig(calib_prompts="chat-train[0:2]", calib_concurrency=(1,),
                                calib_requests=1.0, temperatures=(0.0,), max_tokens=16,
                                parallel=2, concurrency=(1,), specs=("none",))  # fmt: skip
    conf = tmp_path / "config.json"
    conf.write_text(json.dumps(asdict(cfg), default=str))
    out = tmp_path / "cost.csv"
    assert m.main([str(conf), "--specs", "none", "--cycles", "1", "--out", str(out)]) == 0
    table = pd.read_csv(out)
    assert sorted(table["step_log"].tolist()) == [False, True]
    assert (table["throughput_tok_s"] > 0).all() and set(table["concurrency"]) == {1}
