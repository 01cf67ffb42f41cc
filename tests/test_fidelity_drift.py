"""The machine's drift under a llama-server grid (``--drift-probe``, specsim.fidelity.llama.drift):
a profile's times scaled to a run's speed, the speeds read off the probes between rounds, the
probe called around every round, each run simulated at its own speed, and, slow, a real grid
that probes its server and scores both ways."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from specsim.errors import SpecsimError
from specsim.fidelity.llama.config import LlamaValidationConfig
from specsim.sim.cost.model import CostModel, time_scaled
from specsim.sim.cost.tables import COST_KEYS


def _model(**kw) -> CostModel:
    return CostModel(name="m", batch_tokens=np.array([1, 64]), step_ms=np.array([4.0, 20.0]),
                     draft_curve=((1, 2.0), (8, 5.0)), step_overhead_ms=0.5,
                     emit_per_token_ms=0.1, pass_extra_ms=0.7, passes_by_slot=1,
                     max_running=8, **kw)  # fmt: skip


def test_a_scaled_profile_prices_every_time_it_holds_at_the_factor():
    m = _model(sched_base_us=3.0)
    two = time_scaled(m, 2.0)
    b = np.array([1, 10, 64, 100])
    np.testing.assert_allclose(two.step_time(b), 2.0 * m.step_time(b))
    for key in COST_KEYS:
        assert getattr(two, key) == pytest.approx(2.0 * getattr(m, key)), key
    assert two.draft_curve == ((1, 4.0), (8, 10.0))
    assert (two.max_running, two.passes_by_slot, two.kv_tokens) == (8, 1, m.kv_tokens)
    assert time_scaled(m, 1.0) is m
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(SpecsimError, match="positive"):
            time_scaled(m, bad)


def test_a_run_on_a_machine_half_as_fast_is_simulated_twice_as_slow():
    """The real simulator over a real trace: every step at twice the time doubles the mean
    TPOT of a closed loop (its arrivals are its finishes, so nothing else sets the pace)."""
    from specsim.sim.simulate import replay
    from specsim.trace.synth import synth_trace

    trace = synth_trace(n_requests=12, accept_profile=[0.8, 0.6, 0.4], seed=3)
    m = CostModel(name="m", batch_tokens=np.array([1, 512]), step_ms=np.array([5.0, 40.0]))
    one = replay(trace, "ar", concurrency=2, requests=12, seed=0, profile=m)
    two = replay(trace, "ar", concurrency=2, requests=12, seed=0, profile=time_scaled(m, 2.0))
    assert two.summary["tpot_ms_mean"] == pytest.approx(2.0 * one.summary["tpot_ms_mean"])


def _probes(tpots: dict[int, float]) -> pd.DataFrame:
    return pd.DataFrame([{"after_round": r, "tpot_ms_mean": v, "load_1m": 1.0}
                         for r, v in tpots.items()])  # fmt: skip


def test_a_rounds_speed_is_the_mean_of_the_probes_either_side_over_the_first():
    from specsim.fidelity.llama.drift import round_speeds, run_speeds

    sp = round_speeds(_probes({-1: 4.0, 0: 4.0, 1: 6.0, 2: 8.0}))
    assert sp == pytest.approx({0: 1.0, 1: 1.25, 2: 1.75, 3: 2.0})  # 3: a grid stopped early
    runs = pd.DataFrame({"round": [2, 0, 1, 1]}, index=[10, 11, 12, 13])
    got = run_speeds(runs, _probes({-1: 4.0, 0: 4.0, 1: 6.0, 2: 8.0}))
    assert got.to_dict() == pytest.approx({10: 1.75, 11: 1.0, 12: 1.25, 13: 1.25})
    stopped = round_speeds(_probes({-1: 4.0, 0: 5.0}))  # a last round without its probe
    assert run_speeds(pd.DataFrame({"round": [1]}), _probes({-1: 4.0, 0: 5.0}))[0] == 1.25
    assert stopped == pytest.approx({0: 1.125, 1: 1.25})
    with pytest.raises(SpecsimError, match="before the first round"):
        round_speeds(_probes({0: 4.0, 1: 5.0}))
    with pytest.raises(SpecsimError, match="positive"):
        round_speeds(_probes({-1: 4.0, 0: float("nan")}))
    with pytest.raises(SpecsimError, match="round 3"):
        run_speeds(pd.DataFrame({"round": [3]}), _probes({-1: 4.0, 0: 5.0, 1: 5.0}))


def test_the_probe_runs_before_the_first_round_and_after_every_round(monkeypatch):
    from specsim.fidelity.llama import grid

    cfg = LlamaValidationConfig(specs=("none", "ngram:3"), concurrency=(2,), rates=(),
                                temperatures=(0.0,), target_ci=0.03, min_repeats=3,
                                max_repeats=4, warmup=1, drift_probe=2)  # fmt: skip
    events: list = []

    def fake_run_cell(cfg, s, srv, inputs, trace, t, c, rate, seed=None):
        events.append(s.name)
        wide = 0.2 * (events.count(s.name) % 2) if s.name == "ngram:3" else 0.0
        return {"spec": s.name, "temperature": t, "concurrency": c, "rate": rate,
                "throughput_tok_s": 50.0 * (1 + wide), "tpot_ms_mean": 20.0,
                "outputs_as_trace": 1.0}  # fmt: skip

    monkeypatch.setattr(grid, "run_cell", fake_run_cell)
    servers = {"none": "a", "ngram:3": "b"}
    traces = {("none", 0.0): None, ("ngram:3", 0.0): None}
    rows = grid.interleaved_runs(cfg, servers, None, traces, lambda m: None, events.append)
    # warm-up round 0, rounds 1-3 with both cells, round 4 with ngram:3 alone (never tight)
    assert events == [-1, "none", "ngram:3", 0, "none", "ngram:3", 1, "none", "ngram:3", 2,
                      "none", "ngram:3", 3, "ngram:3", 4]  # fmt: skip
    assert max(r["round"] for r in rows) == 4


def test_the_first_probe_warms_the_server_unmeasured_and_every_probe_sends_the_same_jobs(
    monkeypatch,
):
    from specsim.fidelity.llama import drift, servers

    sent = []

    def fake_send(srv, ids, lengths, temperature, seed, concurrency, rate=None, requests=None):
        sent.append((len(ids), seed, requests))
        n = requests or len(ids)
        res = [type("R", (), {"error": None})() for _ in range(n)]
        return [None] * n, res, {"tpot_ms_mean": 5.0 + len(sent), "throughput_tok_s": 100.0}

    monkeypatch.setattr(servers, "send", fake_send)
    cfg = LlamaValidationConfig(specs=("none",), target_ci=0.05, drift_probe=3, seed=4)
    ids, lengths = [[1, 2], [3, 4], [5]], [20, 30, 40]
    first = drift.probe(cfg, "srv", ids, lengths, drift.START, lambda m: None)
    later = drift.probe(cfg, "srv", ids, lengths, 0, lambda m: None)
    assert sent == [(1, 4, None), (3, 5, 3), (3, 5, 3)]  # the warm-up: one short request
    assert first["tpot_ms_mean"] == 7.0 and later["tpot_ms_mean"] == 8.0
    assert (first["after_round"], later["after_round"], later["requests"]) == (-1, 0, 3)


def test_a_probe_needs_a_target_ci_grid_with_a_plain_server():
    ok = LlamaValidationConfig(specs=("none", "ngram:3"), target_ci=0.05, drift_probe=2)
    assert ok.drift_probe == 2
    for kw in ({"target_ci": None}, {"specs": ("ngram:3",)}, {"drift_probe": -1}):
        with pytest.raises(SpecsimError, match="--drift-probe"):
            LlamaValidationConfig(**{"specs": ("none", "ngram:3"), "target_ci": 0.05,
                                     "drift_probe": 2, **kw})  # fmt: skip


def test_calibration_between_rounds_needs_a_target_ci_grid_that_calibrates(tmp_path):
    ok = LlamaValidationConfig(target_ci=0.05, calib_schedule="rounds")
    assert ok.calib_schedule == "rounds"
    with pytest.raises(SpecsimError, match="'before' or 'rounds'"):
        LlamaValidationConfig(target_ci=0.05, calib_schedule="during")
    for t in (0, 1):  # a folder an earlier run wrote, as far as the config checks
        (tmp_path / f"profile-t{t}.csv").write_text("x\n")
    for kw in ({"target_ci": None}, {"profile": tmp_path}):
        with pytest.raises(SpecsimError, match="--calib-schedule rounds"):
            LlamaValidationConfig(**{"target_ci": 0.05, "calib_schedule": "rounds", **kw})


def test_compare_with_probes_simulates_each_run_at_its_rounds_speed(monkeypatch):
    """Three kept runs in rounds at speed 1, 1.5 and 2 (a warm-up in round 0): the simulated
    cell is the median of the three runs each simulated on the profile scaled by its speed;
    without the probes, the profile as calibrated."""
    from specsim.fidelity.llama import grid

    def fake_sim(cfg, s, trace, cost, c, rate, slots=None, seed=None):
        step = float(cost.step_time(np.array([1]))[0]) * 1e3  # 4 ms times the run's speed
        return {"throughput_tok_s": 1000.0 / step, "tpot_ms_mean": step,
                "requests_completed": 8}  # fmt: skip

    monkeypatch.setattr(grid, "simulate_cell", fake_sim)
    base = {"spec": "none", "temperature": 0.0, "concurrency": 2, "rate": np.nan,
            "requests": 6, "ttft_ms_mean": 1.0, "e2e_ms_mean": 2.0,
            "steady_throughput_tok_s": 1.0, "server_drafted": 0, "server_accepted": 0,
            "outputs_as_trace": 1.0, "requests_counts_exact": 1.0, "throughput_tok_s": 100.0,
            "tpot_ms_mean": 6.0}  # fmt: skip
    runs = pd.DataFrame([{**base, "round": r, "warmup": r == 0} for r in range(4)])
    probes = _probes({-1: 4.0, 0: 4.0, 1: 4.0, 2: 8.0, 3: 8.0})  # speeds 1, 1, 1.5, 2
    cfg = LlamaValidationConfig(target_ci=0.5)
    costs = {(False, 0.0): _model()}
    plain = grid.compare(cfg, runs, {("none", 0.0): None}, costs)
    drifted = grid.compare(cfg, runs, {("none", 0.0): None}, costs, probes)
    assert plain.iloc[0]["sim_tpot_ms_mean"] == pytest.approx(4.0)
    assert drifted.iloc[0]["sim_tpot_ms_mean"] == pytest.approx(6.0)  # median of 4, 6, 8
    assert drifted.iloc[0]["err_tpot_mean_wall"] == pytest.approx(0.0)
    from specsim.fidelity.llama.drift import section
    from specsim.fidelity.llama.report import goals

    text = section(probes, goals(drifted))
    assert "| start | 4.00 | 1.00 |" in text and "**1.00-2.00**" in text
    assert "mean TPOT **0.0%**" in text


@pytest.mark.slow
@pytest.mark.real_server
def test_a_probed_grid_on_llama_server_scores_as_measured_and_at_each_runs_speed(tmp_path):
    """A tiny --target-ci grid on a real server with --drift-probe 2: a probe after the
    calibration and after each round (the warm-up's included), both tables, the README's
    section, and a rescore that needs no server."""
    out = tmp_path / "llama"
    argv = ["validate", "--engine", "llama-server", "--prompts", "copy-edit[0:3]",
            "--specs", "none", "--concurrency", "1", "--rates", "2", "--temperatures", "0",
            "--min-requests", "2", "--open-requests", "2", "--max-tokens", "16",
            "--calib-prompts", "copy-edit[32:35]", "--calib-concurrency", "1,2",
            "--calib-requests", "1", "--parallel", "2", "--target-ci", "0.5",
            "--min-repeats", "2", "--max-repeats", "2", "--warmup", "1", "--drift-probe", "2",
            "--target-type", "Q4_0-pure", "--step-clock", "server", "--out", str(out)]  # fmt: skip
    from specsim.cli import main

    assert main(argv) == 0
    probes = pd.read_csv(out / "probes.csv")
    assert probes["after_round"].tolist() == [-1, 0, 1, 2]
    assert (probes["tpot_ms_mean"] > 0).all() and (probes["requests"] == 2).all()
    plain, drifted = pd.read_csv(out / "fidelity.csv"), pd.read_csv(out / "fidelity-drift.csv")
    assert len(plain) == len(drifted) == 2
    assert (plain["real_tpot_ms_mean"] == drifted["real_tpot_ms_mean"]).all()
    assert np.isfinite(drifted["sim_tpot_ms_mean"]).all()
    assert "## The machine's drift" in (out / "README.md").read_text()
    assert json.loads((out / "config.json").read_text())["drift_probe"] == 2
    assert main([*argv, "--rescore"]) == 0
    calib = pd.read_csv(out / "calibration.csv")  # once, before the grid (the default)
    assert len(calib) == 2 and calib["round"].isna().all()


@pytest.mark.slow
@pytest.mark.real_server
def test_calibration_passes_between_the_rounds_price_the_grid(tmp_path):
    """``--calib-schedule rounds`` on a real server: no calibration before the grid, one pass
    of every setting's loads after each round (warm-up included), each on the setting's
    logging server kept up for the grid, its steps and rows labelled by round, and the
    profile fitted on all of them (a rescore on one round's loads is the same runs)."""
    out = tmp_path / "llama"
    argv = ["validate", "--engine", "llama-server", "--prompts", "copy-edit[0:3]",
            "--specs", "none,ngram:3", "--concurrency", "1", "--rates", "2",
            "--temperatures", "0", "--min-requests", "2", "--open-requests", "2",
            "--max-tokens", "16", "--calib-prompts", "copy-edit[32:35]",
            "--calib-concurrency", "1,2", "--calib-requests", "1", "--parallel", "2",
            "--target-ci", "0.5", "--min-repeats", "2", "--max-repeats", "2", "--warmup", "1",
            "--target-type", "Q4_0-pure", "--step-clock", "server",
            "--calib-schedule", "rounds", "--out", str(out)]  # fmt: skip
    from specsim.cli import main

    assert main(argv) == 0
    calib = pd.read_csv(out / "calibration.csv")
    rounds = calib.groupby(["spec", "concurrency"])["round"].apply(sorted)
    assert len(rounds) == 4 and all(r == [0, 1, 2] for r in rounds)
    steps = pd.read_parquet(out / "calibration_steps.parquet")
    server = steps[steps["clock"] == "server"]
    assert set(server["round"]) == {0, 1, 2} and (server["duration_s"] > 0).all()
    assert (out / "logs" / "steps" / "calibration-ngram-3.parquet").exists()
    assert not list((out / "logs" / "calibration").glob("*.log"))
    runs = pd.read_csv(out / "runs.csv")
    assert sorted(set(runs["round"])) == [0, 1, 2]
    assert np.isfinite(pd.read_csv(out / "fidelity.csv")["sim_tpot_ms_mean"]).all()
    assert main([*argv, "--rescore"]) == 0
