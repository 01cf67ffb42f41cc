"""docs/llama-cpp.md's worked example (issue #48, item 4) is runnable as printed: its replay
command, applied to each setting's trace and profile in reports/llama-cpp-held-out, gives the
predictions its table states, which are the held-out grid's simulated cells. Why: a worked
example whose numbers a reader cannot reproduce teaches nothing."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pandas as pd
import pytest

from specsim.cli import main

ROOT = Path(__file__).parents[1]
DOC = ROOT / "docs" / "llama-cpp.md"
REPORT = ROOT / "reports" / "llama-cpp-held-out"


def _section() -> str:
    text = DOC.read_text()
    start = text.index("### Worked example: does DSpark drafting pay")
    return text[start : text.index("\n## ", start)]


def _command() -> list[str]:
    block = re.search(r"```\s*\n\s*(specsim replay .*?)```", _section(), re.S)
    assert block, "the worked example lost its replay command"
    return shlex.split(block.group(1).replace("\\\n", " "))[1:]  # without "specsim"


def _table() -> dict[str, tuple[float, float]]:
    rows = re.findall(r"^\s*\| `?([\w:.]+)`? \| ([\d.]+) \| ([\d.]+) \|", _section(), re.M)
    return {name: (float(tps), float(tpot)) for name, tps, tpot in rows}


@pytest.mark.parametrize("spec", ["none", "dspark:7", "dspark:4", "dspark:7:0.5"])
def test_the_worked_example_reproduces_its_table_and_the_grid(spec, capsys):
    argv = _command()
    name = spec.replace(":", "-")
    argv[1] = str(REPORT / "traces" / f"trace-{name}-t0.parquet")
    if spec == "none":  # as the doc says: no drafting is `ar` on the plain server's profile
        argv[argv.index("--policy") + 1] = "ar"
        i = argv.index("--profile") + 1
        argv[i] = argv[i].replace("profile-drafter-t0.csv", "profile-t0.csv")
    argv = [str(ROOT / a) if a.startswith("reports/") else a for a in argv]
    assert main(argv) == 0
    out = capsys.readouterr().out
    tpot = float(re.search(r"Mean TPOT \(ms\):\s+([\d.]+)", out).group(1))
    grid = pd.read_csv(REPORT / "fidelity.csv")
    cell = grid[(grid["spec"] == spec) & (grid["temperature"] == 0) & (grid["concurrency"] == 5)]
    assert len(cell) == 1
    assert tpot == pytest.approx(float(cell["sim_tpot_ms_mean"].iloc[0]), abs=0.01)
    doc_tps, doc_tpot = _table()[spec]
    assert doc_tpot == pytest.approx(tpot, abs=0.05)
    assert doc_tps == pytest.approx(float(cell["sim_throughput_tok_s"].iloc[0]), abs=0.05)
