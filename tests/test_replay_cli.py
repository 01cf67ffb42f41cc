"""``specsim replay`` end to end on a real Parquet trace: JSON keys, one-line errors, --out."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from specsim.cli import main
from specsim.sim.toy import iid_trace

SUMMARY_KEYS = {
    "throughput_tok_s",
    "per_user_tps_mean",
    "ttft_ms_p50",
    "ttft_ms_p99",
    "tpot_ms_p50",
    "tpot_ms_p99",
    "tpot_ms_mean",
    "tau",
    "verified_draft_tokens",
    "accepted_draft_tokens",
    "verify_efficiency",
    "mean_batch_tokens",
    "requests_completed",
    "sim_time_s",
    "wall_time_s",
    "sla_attainment",
    "sla_tps",
}


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory):
    from specsim.trace.io import write_trace

    path = tmp_path_factory.mktemp("trace") / "iid.parquet"
    write_trace(iid_trace(40, 60, alpha=0.8, seed=1), path)
    return str(path)


def test_json_has_the_summary_and_config(trace_file, capsys):
    rc = main(
        [
            "replay",
            trace_file,
            "--policy",
            "hw-aware",
            "--rate",
            "10",
            "--requests",
            "60",
            "--sla-tps",
            "100",
            "--json",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert SUMMARY_KEYS <= set(out)
    assert out["requests_completed"] == 60
    assert out["config"]["policy"] == "hw-aware" and out["config"]["rate"] == 10.0
    assert 0.0 <= out["sla_attainment"] <= 1.0


def test_readable_table(trace_file, capsys):
    assert main(["replay", trace_file, "--policy", "mtp1", "--concurrency", "8"]) == 0
    text = capsys.readouterr().out
    for word in ("mtp1", "closed loop, 8 concurrent", "throughput", "TTFT", "TPOT", "tau"):
        assert word in text


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra, msg",
    [
        (["--rate", "-3"], "--rate"),
        (["--rate", "1", "--concurrency", "2"], "not allowed with argument"),
        (["--policy", "nonesuch"], "unknown policy"),
        (["--profile", "nonesuch"], "unknown profile"),
        (["--profile", "missing.csv"], "does not exist"),
        (["--arrivals", "missing.csv"], "does not exist"),
        (["--concurrency", "2", "--cv", "2"], "--cv"),
        (["--kv-tokens", "5"], "give a larger --kv-tokens"),
        (["--max-running", "0"], "--max-running"),
        (["--sla-tps", "-1"], "--sla-tps"),
        (["--requests", "3", "--duration", "2"], "not allowed with argument"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(trace_file, extra, msg):
    proc = subprocess.run(
        [sys.executable, "-m", "specsim.cli", "replay", trace_file, *extra],
        capture_output=True,
        text=True,
        env={"SPECSIM_PROGRESS": "0", "PATH": "", "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and msg in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_missing_trace_exits_2(tmp_path, capsys):
    assert main(["replay", str(tmp_path / "none.parquet")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_out_writes_parquet_and_refuses_overwrite(trace_file, tmp_path, capsys):
    out = tmp_path / "req.parquet"
    args = ["replay", trace_file, "--concurrency", "4", "--out", str(out)]
    assert main(args) == 0
    df = pd.read_parquet(out)
    assert len(df) == 40 and {"ttft_ms", "tpot_ms", "per_user_tps"} <= set(df.columns)
    before = out.read_bytes()
    capsys.readouterr()
    assert main([*args, "--seed", "3"]) == 2
    assert "--force" in capsys.readouterr().err
    assert out.read_bytes() == before
    assert main([*args, "--seed", "3", "--force"]) == 0
    assert list(tmp_path.iterdir()) == [out]  # no temporary file left behind
