"""Sweeps on the real engine: tidy table, local == in-process == Dask, resume after a kill,
never a half-written file, the max-load search, and the CLI's one-line errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from specsim.analysis.maxload import find_max_load
from specsim.analysis.sweep import build_cells, deterministic_columns, run_cell, sweep
from specsim.cli import main
from specsim.errors import SpecsimError
from specsim.trace.io import write_trace
from specsim.trace.synth import synth_trace

POLICIES = ["mtp1", "hw-aware", "zos"]
LOADS = [1, 4, 16]


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory) -> str:
    t = synth_trace(n_requests=60, accept_profile=[0.8, 0.7, 0.65, 0.6, 0.6], seed=3)
    p = tmp_path_factory.mktemp("tr") / "synthetic-small.parquet"
    write_trace(t, p)
    return str(p)


@pytest.fixture(scope="module")
def reference(trace_path) -> pd.DataFrame:
    return sweep(trace_path, POLICIES, concurrency=LOADS, seeds=2, requests=40, workers=1)


def _same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    cols = deterministic_columns(a)
    assert cols == deterministic_columns(b)
    pd.testing.assert_frame_equal(a[cols].reset_index(drop=True), b[cols].reset_index(drop=True))


@pytest.mark.slow
def test_table_is_tidy_one_row_per_cell(reference, trace_path):
    t = reference
    assert len(t) == len(POLICIES) * len(LOADS) * 2
    assert not t.duplicated(["policy", "load", "replicate"]).any()
    for col in ("trace", "policy", "profile", "load", "concurrency", "replicate", "seed"):
        assert col in t.columns
    for col in ("throughput_tok_s", "per_user_tps_mean", "tau", "ttft_ms_p99", "tpot_ms_p50"):
        assert col in t.columns and t[col].notna().all()
    assert set(t["trace"]) == {"synthetic-small"}
    # grid order: policy, then load, then replicate
    assert list(t["policy"]) == [p for p in POLICIES for _ in LOADS for _ in range(2)]
    assert (t["requests_completed"] == 40).all()
    # every row is the replay of its own cell
    cell = build_cells(trace_path, POLICIES, concurrency=LOADS, seeds=2, requests=40)[5]
    row = run_cell(cell)
    assert row["throughput_tok_s"] == t.iloc[5]["throughput_tok_s"]


def test_policies_share_arrivals_but_seeds_differ_across_replicates(reference):
    s = reference.groupby(["load", "replicate"])["seed"].nunique()
    assert (s == 1).all()
    assert reference.groupby("policy")["seed"].nunique().eq(len(LOADS) * 2).all()


def test_local_processes_give_the_same_table(reference, trace_path):
    par = sweep(trace_path, POLICIES, concurrency=LOADS, seeds=2, requests=40, workers=2)
    _same(reference, par)
    assert par.attrs["cells_run"] == len(par)


@pytest.mark.slow  # fast suite under 5 min: over 2.8 s alone (CI runs it)
def test_dask_cluster_gives_the_same_table(reference, trace_path):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None
    ) as cluster:
        by_address = sweep(
            trace_path,
            POLICIES,
            concurrency=LOADS,
            seeds=2,
            requests=40,
            dask=cluster.scheduler_address,
        )
        with distributed.Client(cluster) as client:
            by_client = sweep(
                trace_path, POLICIES, concurrency=LOADS, seeds=2, requests=40, dask=client
            )
    _same(reference, by_address)
    _same(reference, by_client)


@pytest.mark.slow
def test_out_file_then_rerun_runs_nothing(reference, trace_path, tmp_path):
    out = tmp_path / "r.parquet"
    first = sweep(trace_path, POLICIES, concurrency=LOADS, seeds=2, requests=40, out=out, workers=1)
    _same(reference, first)
    _same(reference, pd.read_parquet(out))
    assert not (tmp_path / "r.parquet.parts").exists()
    again = sweep(trace_path, POLICIES, concurrency=LOADS, seeds=2, requests=40, out=out, workers=1)
    assert again.attrs["cells_run"] == 0
    _same(reference, again)
    # a bigger grid (one more load) runs only the new cells and keeps the old ones
    more = sweep(
        trace_path, POLICIES, concurrency=[*LOADS, 32], seeds=2, requests=40, out=out, workers=1
    )
    assert more.attrs["cells_run"] == len(POLICIES) * 2
    _same(reference, more[more["load"] != 32])


@pytest.mark.slow  # fast suite under 5 min: over 2.8 s alone (CI runs it)
def test_killed_sweep_resumes_only_missing_cells(trace_path, tmp_path):
    """Kill the CLI mid-sweep: no results file appears, finished cells survive as parts, and
    the same command then runs only the rest; the table equals an uninterrupted run."""
    out = tmp_path / "killed.parquet"
    loads = "1,2,3,...,12"
    argv = [
        trace_path,
        "--policies",
        ",".join(POLICIES),
        "--concurrency",
        loads,
        "--requests",
        "40",
        "--workers",
        "1",
        "--out",
        str(out),
    ]
    env = dict(os.environ, SPECSIM_PROGRESS="0")
    proc = subprocess.Popen(
        [sys.executable, "-m", "specsim.cli", "sweep", *argv],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    parts = tmp_path / "killed.parquet.parts"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if parts.is_dir() and len(list(parts.glob("*.parquet"))) >= 2:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the sweep finished before it could be interrupted"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not out.exists(), "an interrupted sweep must not leave a results file"
    n_done = len(list(parts.glob("*.parquet")))
    total = len(POLICIES) * 12
    assert 2 <= n_done < total

    resumed = sweep(trace_path, POLICIES, concurrency=range(1, 13), requests=40, out=out, workers=1)
    assert resumed.attrs["cells_reused"] == n_done
    assert resumed.attrs["cells_run"] == total - n_done
    fresh = sweep(trace_path, POLICIES, concurrency=range(1, 13), requests=40, workers=1)
    _same(fresh, resumed)
    _same(fresh, pd.read_parquet(out))
    assert not parts.exists()


def test_existing_files_are_not_overwritten_without_force(trace_path, tmp_path):
    out = tmp_path / "x.parquet"
    pd.DataFrame({"a": [1]}).to_parquet(out)
    with pytest.raises(SpecsimError, match="not a specsim sweep table"):
        sweep(trace_path, ["mtp1"], concurrency=[1], requests=10, out=out)
    sweep(trace_path, ["mtp1"], concurrency=[1, 2], requests=10, out=out, force=True)
    with pytest.raises(SpecsimError, match="not in this sweep"):
        sweep(trace_path, ["mtp1"], concurrency=[1], requests=10, out=out)
    assert len(pd.read_parquet(out)) == 2


def test_changed_trace_is_not_reused(trace_path, tmp_path):
    """Same path, new content: cell keys differ, so old rows are refused, not silently reused."""
    p = tmp_path / "t.parquet"
    p.write_bytes(Path(trace_path).read_bytes())
    out = tmp_path / "r.parquet"
    sweep(str(p), ["mtp1"], concurrency=[2], requests=10, out=out)
    write_trace(synth_trace(n_requests=30, accept_profile=[0.5, 0.4], seed=9), p, force=True)
    with pytest.raises(SpecsimError, match="not in this sweep"):
        sweep(str(p), ["mtp1"], concurrency=[2], requests=10, out=out)


def test_rate_sweep_has_rate_columns(trace_path):
    t = sweep(trace_path, ["mtp1", "zos"], rates=[2.0, 8.0], requests=30, workers=1)
    assert t["load_kind"].eq("rate").all()
    assert t["rate"].tolist() == [2.0, 8.0, 2.0, 8.0]
    assert t["concurrency"].isna().all()


@pytest.mark.slow
def test_find_max_load_is_the_edge_of_the_sla(trace_path):
    """The answer meets the SLA and the next concurrency up does not (a real bisection)."""
    # between the speeds of this trace on the default llama-3-8b-h100 (found: mtp1 ~217 tok/s
    # at 1 in flight, hw-aware and zos ~363 at 1 and under 280 at 24): mtp1 never meets it
    sla = 280.0
    res = find_max_load(
        trace_path, POLICIES, sla_tps=sla, concurrency=[1, 24], requests=40, workers=1
    )
    assert list(res["policy"]) == POLICIES
    for _, row in res.iterrows():
        if not row["feasible"]:
            one = sweep(trace_path, [row["policy"]], concurrency=[1], requests=40, workers=1)
            assert one["per_user_tps_mean"].iloc[0] < sla
            continue
        m = int(row["max_load"])
        loads = [m] if row["capped"] else [m, m + 1]
        s = sweep(trace_path, [row["policy"]], concurrency=loads, requests=40, workers=1)
        assert s["per_user_tps_mean"].iloc[0] >= sla
        assert row["per_user_tps_mean"] == s["per_user_tps_mean"].iloc[0]
        if not row["capped"]:
            assert s["per_user_tps_mean"].iloc[1] < sla
        assert row["probes"] <= 2 + int(np.ceil(np.log2(24)))
    assert not res["feasible"].all(), "the infeasible branch is exercised"
    assert (res["feasible"] & ~res["capped"]).any(), "a real bisection happened"


def test_cli_sweep_and_find_max_rate(trace_path, tmp_path, capsys):
    out = tmp_path / "cli.parquet"
    rc = main(
        [
            "sweep",
            trace_path,
            "--policies",
            "mtp1,zos",
            "--concurrency",
            "1,2,4",
            "--requests",
            "20",
            "--workers",
            "1",
            "--out",
            str(out),
        ]
    )
    assert rc == 0 and len(pd.read_parquet(out)) == 6
    assert "6 cells (6 run, 0 already done)" in capsys.readouterr().err
    mx = tmp_path / "max.parquet"
    rc = main(
        [
            "sweep",
            trace_path,
            "--policies",
            "mtp1,zos",
            "--rates",
            "0.5,50",
            "--requests",
            "20",
            "--workers",
            "1",
            "--find-max-rate",
            "--sla-tps",
            "40",
            "--out",
            str(mx),
        ]
    )
    assert rc == 0
    table = pd.read_parquet(mx)
    assert list(table["policy"]) == ["mtp1", "zos"] and (table["load_kind"] == "rate").all()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["nope.parquet", "--policies", "mtp1", "--concurrency", "1"], "does not exist"),
        (["{t}", "--policies", "mtp1", "--concurrency", "1,x"], "not a number"),
        (["{t}", "--policies", "nope", "--concurrency", "1", "--workers", "1"], "unknown policy"),
        (["{t}", "--policies", "mtp1", "--concurrency", "1", "--find-max-rate"], "--sla-tps"),
        (["{t}", "--policies", "mtp1", "--concurrency", "1", "--seeds", "0"], "--seeds"),
    ],
)
def test_cli_errors_are_one_line_exit_2(trace_path, tmp_path, capsys, args, needle):
    args = [a.replace("{t}", trace_path) for a in args]
    rc = main(["sweep", *args, "--out", str(tmp_path / "o.parquet")])
    err = capsys.readouterr().err
    assert rc == 2
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.slow
def test_find_max_load_on_dask_matches_local(trace_path):
    distributed = pytest.importorskip("distributed")
    kw = dict(sla_tps=280.0, concurrency=[1, 24], requests=40)
    local = find_max_load(trace_path, ["zos"], workers=1, **kw)
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None
    ) as cluster:
        remote = find_max_load(trace_path, ["zos"], dask=cluster.scheduler_address, **kw)
    assert remote["max_load"].tolist() == local["max_load"].tolist()
    assert remote["throughput_tok_s"].tolist() == local["throughput_tok_s"].tolist()


def test_in_memory_row_has_the_dtypes_of_its_part(trace_path, tmp_path):
    """A fresh sweep keeps each row as built (no read-back of its part): it must be the frame
    a resumed sweep reads from that part, value for value and dtype for dtype."""
    from specsim.analysis.sweep import _row_frame
    from specsim.outputs import write_table

    for kw in ({"concurrency": [4], "requests": 20}, {"rates": [30.0], "duration": 2.0}):
        cell = build_cells(trace_path, ["zos"], **kw)[0]
        row = run_cell(cell)
        assert any(v != v for v in row.values())  # NaN knobs (rate or duration) and metrics
        frame = _row_frame(row)
        path = write_table(frame, tmp_path / f"{cell.key_hash}.parquet")
        back = pd.read_parquet(path)
        pd.testing.assert_frame_equal(frame, back, check_exact=True)
        assert list(frame.dtypes) == list(back.dtypes)
