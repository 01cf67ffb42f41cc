"""``--trace-draws K`` of ``specsim validate --engine llama-server``: K recording runs of every
speculative setting's trace, each its own draw (draw 0 at the grid's seed, the others at seeds
no measured run sends), and kept run j of a cell simulated on draw j mod K, so a cell's
simulated acceptance averages K sampled answers as its real runs do (PLAN step 23)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from specsim.cli import main
from specsim.errors import SpecsimError
from specsim.fidelity.llama.config import MAX_SEED, LlamaValidationConfig

SERVER = {"ngram_trace": "server", "specs": ("none", "ngram:3")}


def test_a_draws_seed_is_the_grids_for_draw_0_and_no_runs_for_the_others():
    cfg = LlamaValidationConfig(seed=7, trace_draws=5, **SERVER)
    assert cfg.draw_seed(0) == 7
    seeds = [cfg.draw_seed(k) for k in range(1, 5)]
    runs = {cfg.seed + i for i in range(1001)}  # every run index the repeat rule allows
    assert len(set(seeds)) == 4 and not set(seeds) & runs
    top = LlamaValidationConfig(seed=MAX_SEED, trace_draws=3, **SERVER)
    assert all(0 <= top.draw_seed(k) <= MAX_SEED for k in range(3))


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        ({"trace_draws": 0}, r"--trace-draws must be in \[1, 100\], got 0"),
        ({"trace_draws": 101}, r"--trace-draws must be in \[1, 100\], got 101"),
        ({"trace_draws": 2, "specs": ("none", "ngram:3")}, "give --ngram-trace server"),
    ],
)
def test_trace_draws_out_of_range_or_without_server_traces_is_refused(flags, match):
    with pytest.raises(SpecsimError, match=match):
        LlamaValidationConfig(**flags)


def test_the_cli_refuses_draws_of_a_port_trace_in_one_line(capsys):
    rc = main(["validate", "--engine", "llama-server", "--specs", "none,ngram:3",
               "--trace-draws", "3", "--out", "/nonexistent/x"])  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "--ngram-trace server" in err
    assert "Traceback" not in err


def test_plain_settings_need_no_server_traces_for_draws():
    assert LlamaValidationConfig(specs=("none",), trace_draws=4).trace_draws == 4


def _runs(n_kept: int, spec: str = "ngram:3") -> pd.DataFrame:
    base = {"spec": spec, "temperature": 1.0, "concurrency": 2, "rate": np.nan,
            "requests": 10, "ttft_ms_mean": 1.0, "e2e_ms_mean": 2.0,
            "steady_throughput_tok_s": 1.0, "server_drafted": 100, "server_accepted": 40,
            "outputs_as_trace": 0.0, "requests_counts_exact": 1.0,
            "throughput_tok_s": 100.0, "tpot_ms_mean": 10.0}  # fmt: skip
    rows = [{**base, "warmup": True, "repeat": -1, "round": 0, "arrival_seed": 0}]
    rows += [{**base, "warmup": False, "repeat": j, "round": j + 1, "arrival_seed": j + 1}
             for j in range(n_kept)]  # fmt: skip
    return pd.DataFrame(rows)


def _fake(seen: list):
    """A simulator whose acceptance is the trace's (a string naming the draw here)."""
    acc = {"a": 0.30, "b": 0.50, "c": 0.40}

    def sim(cfg, s, trace, cost, c, rate, slots=None, seed=None):
        seen.append((trace, seed))
        return {"throughput_tok_s": 100.0, "tpot_ms_mean": 10.0, "requests_completed": 10,
                "verified_draft_tokens": 1000,
                "accepted_draft_tokens": 1000 * acc[trace]}  # fmt: skip

    return sim


@pytest.mark.parametrize("rule", ["random", "lowest"])
def test_kept_run_j_is_simulated_on_draw_j_mod_k(monkeypatch, rule):
    from specsim.fidelity.llama import grid

    seen: list = []
    monkeypatch.setattr(grid, "simulate_cell", _fake(seen))
    kw = {"terms": ("passes",), "step_clock": "server"} if rule == "random" else {}
    cfg = LlamaValidationConfig(arrival_seeds="per-run", trace_draws=3, slot_rule=rule,
                                **SERVER, **kw)  # fmt: skip
    t = grid.compare(cfg, _runs(5), {("ngram:3", 1.0): ("a", "b", "c")}, {(False, 1.0): None})
    pairs = list(dict.fromkeys(seen))  # (draw, seed), each run once whatever the layouts
    assert pairs == [("a", 1), ("b", 2), ("c", 3), ("a", 4), ("b", 5)]
    # the median over the runs: draws a, b, c, a, b -> acceptance 0.3, 0.5, 0.4, 0.3, 0.5
    assert t.iloc[0]["sim_accept_per_draft"] == pytest.approx(0.4)


def test_one_trace_is_every_runs_as_before(monkeypatch):
    from specsim.fidelity.llama import grid

    seen: list = []
    monkeypatch.setattr(grid, "simulate_cell", _fake(seen))
    cfg = LlamaValidationConfig(arrival_seeds="per-run", **SERVER)
    t = grid.compare(cfg, _runs(3), {("ngram:3", 1.0): "b"}, {(False, 1.0): None})
    assert sorted(seen) == [("b", 1), ("b", 2), ("b", 3)]
    assert t.iloc[0]["sim_accept_per_draft"] == pytest.approx(0.5)


def test_fixed_seeds_still_simulate_every_draw_once(monkeypatch):
    from specsim.fidelity.llama import grid

    seen: list = []
    monkeypatch.setattr(grid, "simulate_cell", _fake(seen))
    cfg = LlamaValidationConfig(trace_draws=2, **SERVER)  # --arrival-seeds fixed
    grid.compare(cfg, _runs(4), {("ngram:3", 1.0): ("a", "c")}, {(False, 1.0): None})
    assert sorted(seen) == [("a", None), ("c", None)]


def test_a_runs_trace_warm_ups_on_draw_0_and_one_trace_unchanged():
    from specsim.fidelity.llama.grid import run_trace

    runs = _runs(4)
    assert [run_trace(("a", "b"), r) for _, r in runs.iterrows()] == ["a", "a", "b", "a", "b"]
    assert run_trace("x", runs.iloc[3]) == "x"
    assert run_trace(("a", "b"), pd.Series({"spec": "none"})) == "a"  # runs.csv without repeat


@pytest.mark.slow
@pytest.mark.real_server
def test_two_draws_on_llama_server_record_two_runs_and_score_on_both(tmp_path):
    """A tiny --target-ci grid with --trace-draws 2 on a real server at T = 1: each n-gram
    trace recorded twice (two step logs, two trace files), the report saying so, and a
    rescore that reads both draws back without a server."""
    out = tmp_path / "llama"
    argv = ["validate", "--engine", "llama-server", "--prompts", "copy-edit[0:3]",
            "--specs", "none,ngram:3", "--concurrency", "1", "--rates", "2",
            "--temperatures", "1", "--min-requests", "2", "--open-requests", "2",
            "--max-tokens", "24", "--calib-prompts", "copy-edit[32:35]",
            "--calib-concurrency", "1,2", "--calib-requests", "1", "--parallel", "2",
            "--target-ci", "0.5", "--min-repeats", "2", "--max-repeats", "2", "--warmup", "1",
            "--target-type", "Q4_0-pure", "--step-clock", "server", "--ngram-trace", "server",
            "--arrival-seeds", "per-run", "--trace-draws", "2", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    for name in ("trace-ngram-3-t1.parquet", "trace-ngram-3-t1-d1.parquet",
                 "trace-none-t1.parquet", "trace-none-t1-d1.parquet"):  # fmt: skip
        assert (out / "traces" / name).is_file(), name
    steps = out / "logs" / "steps"
    assert (steps / "steps-ngram-3-t1.parquet").is_file()
    assert (steps / "steps-ngram-3-t1-d1.parquet").is_file()
    from specsim.trace.io import read_trace

    a, b = (read_trace(out / "traces" / f"trace-ngram-3-t1{x}.parquet") for x in ("", "-d1"))
    assert a.n_requests == b.n_requests == 3
    assert "2 recording runs of every speculative trace" in (out / "README.md").read_text()
    first = pd.read_csv(out / "fidelity.csv")
    assert np.isfinite(first["sim_tpot_ms_mean"]).all()
    (out / "traces" / "trace-ngram-3-t1-d1.parquet").unlink()
    assert main([*argv, "--rescore"]) == 2  # a draw missing: nothing to score, one line
    assert main([*argv, "--rescore", "--trace-draws", "1"]) == 0
