"""The repeat rule of the real side of a fidelity grid (specsim/fidelity/repeats.py): the
interval of a cell's median, its coverage measured by simulation, the stopping rule, the
round-robin schedule; its wiring into ``specsim validate --engine llama-server`` (config checks,
warm-ups left out of the scores, the interval columns) and the held-out grid's definition."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binom

from specsim.cli import main
from specsim.errors import SpecsimError
from specsim.fidelity.llama.config import LlamaValidationConfig
from specsim.fidelity.repeats import (
    interleaved_schedule,
    median_interval,
    n_os,
    needs_more,
    order_rank,
    repeats_for,
)

SEED = 20261204
CELLS = 2000
BAND = 0.015  # about 3 binomial standard errors of a 95% coverage over 2,000 cells


def _covers(n: int, sigma: float, rng: np.random.Generator) -> float:
    """Share of CELLS simulated cells of n lognormal runs (true median 100) whose interval
    holds 100."""
    hits = 0
    for _ in range(CELLS):
        iv = median_interval(100.0 * np.exp(rng.normal(0.0, sigma, n)))
        hits += iv.lo <= 100.0 <= iv.hi
    return hits / CELLS


def test_no_order_statistic_interval_below_six_runs_at_95():
    assert n_os(0.95) == 6 and n_os(0.9) == 5
    assert [order_rank(n) for n in (3, 5, 6, 8, 9, 12)] == [0, 0, 1, 1, 2, 3]
    assert median_interval([1.0, 2.0, 3.0]).method == "t-log"
    assert median_interval([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).method == "order"
    iv = median_interval([5.0, 1.0, 4.0, 2.0, 3.0, 6.0])
    assert (iv.median, iv.lo, iv.hi) == (3.5, 1.0, 6.0)
    assert median_interval([7.0]).method == "none" and not median_interval([7.0]).within(0.5)
    assert median_interval([]).n == 0


@pytest.mark.parametrize("n", [3, 5])
def test_small_n_interval_covers_95_percent_of_lognormal_cells(n):
    # t on the log values: exact under lognormal noise, so 95% within the band
    cov = _covers(n, 0.08, np.random.default_rng(SEED + n))
    assert abs(cov - 0.95) <= BAND, cov


@pytest.mark.parametrize("n", [6, 12])
def test_order_statistic_interval_covers_its_binomial_level(n):
    # distribution-free and discrete: its coverage is the binomial one (>= 95%), any noise
    k = order_rank(n)
    exact = 1.0 - 2.0 * float(binom.cdf(k - 1, n, 0.5))
    assert exact >= 0.95
    cov = _covers(n, 0.08, np.random.default_rng(SEED + n))
    assert abs(cov - exact) <= BAND, (cov, exact)


def _noisy(sigmas: dict[str, float], seed: int = SEED):
    """A fake real run: each cell's throughput and TPOT lognormal around 100 and 10, noise
    seeded by (cell, index) so a run's value does not depend on the order cells ran in."""
    calls: list[tuple[str, int]] = []

    def run_one(cell, index):
        calls.append((cell, index))
        rng = np.random.default_rng([seed, sorted(sigmas).index(cell), index])
        s = sigmas[cell]
        return {"throughput_tok_s": 100 * math.exp(rng.normal(0, s)),
                "tpot_ms_mean": 10 * math.exp(rng.normal(0, s))}  # fmt: skip

    return run_one, calls


def test_tight_cells_stop_at_the_minimum_and_wide_ones_are_listed():
    run_one, _ = _noisy({"a": 0.002, "b": 0.3, "c": 0.003})
    s = interleaved_schedule(["a", "b", "c"], run_one, tol=0.03, min_repeats=3,
                             max_repeats=12, warmup=1)  # fmt: skip
    assert len(s.kept("a")) == 3 and len(s.kept("c")) == 3
    assert len(s.kept("b")) == 12  # the maximum, then listed, never dropped
    assert s.wide == ["b"] and s.converged == {"a": True, "b": False, "c": True}
    assert set(s.intervals) == {"a", "b", "c"}
    assert s.intervals["b"]["throughput_tok_s"].n == 12
    assert not s.intervals["b"]["tpot_ms_mean"].within(0.03)


def test_rounds_are_round_robin_over_open_cells_after_the_warm_ups():
    run_one, calls = _noisy({"a": 0.002, "b": 0.3, "c": 0.2})
    s = interleaved_schedule(["a", "b", "c"], run_one, tol=0.03, min_repeats=3,
                             max_repeats=5, warmup=2)  # fmt: skip
    # 2 warm-up rounds, 3 rounds of all, then a has closed and b, c alternate
    order = [c for c, _ in calls]
    assert order[:15] == ["a", "b", "c"] * 5
    assert order[15:] == ["b", "c"] * 2
    assert [r.warmup for r in s.runs[:6]] == [True] * 6 and not any(r.warmup for r in s.runs[6:])
    assert [r.round for r in s.runs if r.cell == "b"] == [0, 1, 2, 3, 4, 5, 6]
    assert [i for c, i in calls if c == "b"] == list(range(7))
    assert len(s.kept("b")) == 5  # warm-ups are not kept


def test_the_schedule_is_deterministic():
    sig = {"a": 0.02, "b": 0.05, "c": 0.01}
    one = interleaved_schedule(list(sig), _noisy(sig)[0], warmup=1)
    two = interleaved_schedule(list(sig), _noisy(sig)[0], warmup=1)
    assert [(r.cell, r.index, r.round, dict(r.result)) for r in one.runs] == [
        (r.cell, r.index, r.round, dict(r.result)) for r in two.runs
    ]
    assert one.intervals == two.intervals


def test_every_metric_must_be_tight_and_failed_runs_count_as_runs():
    tight, wide = [100.0, 100.1, 99.9], [100.0, 130.0, 80.0]
    assert not needs_more(tight, 0.03, 3, 12)
    assert needs_more({"throughput": tight, "tpot": wide}, 0.03, 3, 12)
    assert needs_more(tight[:2], 0.03, 3, 12)  # below the minimum
    assert not needs_more(wide * 4, 0.03, 3, 12)  # at the maximum: stop, wide
    nan = [math.nan] * 4

    def failing(cell, index):
        return {"throughput_tok_s": math.nan, "tpot_ms_mean": math.nan}

    s = interleaved_schedule(["x"], failing, max_repeats=4, warmup=0)
    assert len(s.runs) == 4 and s.wide == ["x"] and needs_more(nan, 0.03, 3, 12)


def _stop_coverage(min_repeats: int, sigma: float = 0.03) -> tuple[float, float]:
    """Coverage of the true median when the rule stops (tol 3%, at most 12 runs) over CELLS
    lognormal cells, and the share that stopped before the maximum."""
    rng = np.random.default_rng(SEED)
    hits = stopped_early = 0
    for _ in range(CELLS):
        noise = rng.normal(0.0, sigma, 12)
        vals: list[float] = []
        while needs_more(vals, 0.03, min_repeats, 12):
            vals.append(100.0 * math.exp(noise[len(vals)]))
        iv = median_interval(vals)
        hits += iv.lo <= 100.0 <= iv.hi
        stopped_early += len(vals) < 12
    return hits / CELLS, stopped_early / CELLS


def test_coverage_at_the_stopping_time():
    """The rule stops on a narrow interval, so coverage when it stops is below the fixed-n
    one: with sigma 3% (half the cells stop before 12 runs) 91.3% at --min-repeats 3, and
    94.9% at 6, where every stop is on the conservative order-statistic interval
    (docs/fidelity.md)."""
    cov3, early3 = _stop_coverage(3)
    assert 0.4 < early3 < 0.6
    assert 0.895 <= cov3 <= 0.93, cov3  # measured 0.913
    cov6, _ = _stop_coverage(6)
    assert abs(cov6 - 0.95) <= BAND, cov6  # measured 0.949


def test_repeats_for_plans_a_grid():
    assert repeats_for(0.04) <= 12 < repeats_for(0.08)
    assert repeats_for(0.001) == 2


@pytest.mark.parametrize(
    "change,match",
    [
        ({"target_ci": 0.0}, "--target-ci"),
        ({"target_ci": 1.5}, "--target-ci"),
        ({"target_ci": float("nan")}, "--target-ci"),
        ({"target_ci": 0.03, "min_repeats": 1}, "--min-repeats"),
        ({"target_ci": 0.03, "min_repeats": 5, "max_repeats": 4}, "--max-repeats"),
        ({"target_ci": 0.03, "warmup": -1}, "--warmup"),
        ({"threads_batch": 0}, "--threads-batch"),
        ({"grid_label": "test"}, "--grid-label"),
    ],
)
def test_config_refuses_a_bad_rule(change, match):
    with pytest.raises(SpecsimError, match=match) as e:
        LlamaValidationConfig(**change)
    assert "\n" not in str(e.value)


def test_cli_bad_tolerance_exits_2_in_one_line(capsys):
    assert main(["validate", "--engine", "llama-server", "--target-ci", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--target-ci" in err


def test_server_pinning_is_explicit():
    from specsim.fidelity.llama.config import SpecSetting
    from specsim.fidelity.llama.servers import server_args

    args = server_args(LlamaValidationConfig(threads=1, parallel=20), SpecSetting("none"))
    assert args[args.index("-t") + 1] == "1" and args[args.index("--threads-batch") + 1] == "1"
    assert args[args.index("-np") + 1] == "20"
    two = server_args(LlamaValidationConfig(threads=1, threads_batch=2), SpecSetting("none"))
    assert two[two.index("--threads-batch") + 1] == "2"


def test_interleaved_runs_go_round_robin_over_every_settings_server(monkeypatch):
    from specsim.fidelity.llama import grid

    cfg = LlamaValidationConfig(specs=("none", "ngram:3"), concurrency=(2,), rates=(),
                                temperatures=(0.0,), target_ci=0.03, min_repeats=3,
                                max_repeats=4, warmup=1)  # fmt: skip
    seen = []

    def fake_run_cell(cfg, s, srv, inputs, trace, t, c, rate, seed=None):
        seen.append((s.name, srv))
        assert seed == cfg.seed  # --arrival-seeds fixed: every run the same draw
        mine = sum(name == s.name for name, _ in seen)
        wide = 0.2 * (mine % 2) if s.name == "ngram:3" else 0.0  # ngram:3 never tight
        return {"spec": s.name, "temperature": t, "concurrency": c, "rate": rate,
                "throughput_tok_s": 50.0 * (1 + wide), "tpot_ms_mean": 20.0,
                "outputs_as_trace": 1.0}  # fmt: skip

    monkeypatch.setattr(grid, "run_cell", fake_run_cell)
    servers = {"none": "srv-none", "ngram:3": "srv-ngram"}
    traces = {("none", 0.0): None, ("ngram:3", 0.0): None}
    rows = grid.interleaved_runs(cfg, servers, None, traces, lambda m: None)
    assert seen[:8] == [("none", "srv-none"), ("ngram:3", "srv-ngram")] * 4
    assert seen[8:] == [("ngram:3", "srv-ngram")]  # none closed after 3 kept runs
    assert [r["warmup"] for r in rows[:2]] == [True, True]
    assert [r["repeat"] for r in rows if r["spec"] == "none"] == [-1, 0, 1, 2]
    assert [r["round"] for r in rows if r["spec"] == "ngram:3"] == [0, 1, 2, 3, 4]


def test_compare_scores_kept_runs_against_the_median_with_its_interval(monkeypatch):
    from specsim.fidelity.llama import grid

    def fake_sim(cfg, s, trace, cost, c, rate, slots=None, seed=None):
        return {"throughput_tok_s": 100.0, "tpot_ms_mean": 10.0, "requests_completed": 10}

    monkeypatch.setattr(grid, "simulate_cell", fake_sim)
    base = {"spec": "none", "temperature": 0.0, "concurrency": 2, "rate": np.nan,
            "requests": 10, "ttft_ms_mean": 1.0, "e2e_ms_mean": 2.0,
            "steady_throughput_tok_s": 1.0, "server_drafted": 0, "server_accepted": 0,
            "outputs_as_trace": 1.0, "requests_counts_exact": 1.0}  # fmt: skip
    thr = [10.0, 99.0, 100.0, 101.0, 100.5, 99.5, 100.2]  # the first a slow warm-up
    runs = pd.DataFrame([{**base, "throughput_tok_s": v, "tpot_ms_mean": 10.0 + 0.01 * i,
                          "warmup": i == 0} for i, v in enumerate(thr)])  # fmt: skip
    cfg = LlamaValidationConfig(grid_label="held-out", target_ci=0.03)
    t = grid.compare(cfg, runs, {("none", 0.0): None}, {(False, 0.0): None})
    row = t.iloc[0]
    assert row["grid"] == "held-out" and row["repeats"] == 6
    assert row["real_throughput_tok_s"] == pytest.approx(np.median(thr[1:]))
    assert row["real_throughput_tok_s_lo"] == 99.0 and row["real_throughput_tok_s_hi"] == 101.0
    assert row["interval"] == "order" and bool(row["converged"])
    assert row["err_throughput_wall"] == pytest.approx(100.0 / np.median(thr[1:]) - 1.0)
    from specsim.fidelity.llama.report import goals, wide_cells

    assert goals(t)["converged_cells"] == 1.0
    assert wide_cells(t).startswith("Every cell")
    wide = t.assign(converged=False)
    assert wide_cells(wide) == "1 cells with a real interval wider than the tolerance: " + (
        "none T=0 C=2."
    )


def test_random_slots_score_a_cell_by_the_median_over_seeded_layouts(monkeypatch):
    """``--slot-rule random``: each cell simulated once per seeded layout (seeds cfg.seed + k,
    distinct, the same on every call), its simulated numbers the median over them."""
    from specsim.fidelity.llama import grid
    from specsim.fidelity.llama.config import RANDOM_LAYOUTS

    seen = []

    def fake_sim(cfg, s, trace, cost, c, rate, slots=None, seed=None):
        seen.append(slots)
        k = len(seen)
        return {"throughput_tok_s": 100.0 + k, "tpot_ms_mean": 10.0 * k, "requests_completed": 8}

    monkeypatch.setattr(grid, "simulate_cell", fake_sim)
    base = {"spec": "none", "temperature": 0.0, "concurrency": 2, "rate": np.nan,
            "requests": 10, "ttft_ms_mean": 1.0, "e2e_ms_mean": 2.0,
            "steady_throughput_tok_s": 1.0, "server_drafted": 0, "server_accepted": 0,
            "outputs_as_trace": 1.0, "requests_counts_exact": 1.0,
            "throughput_tok_s": 100.0, "tpot_ms_mean": 10.0}  # fmt: skip
    runs = pd.DataFrame([base] * 3)
    cfg = LlamaValidationConfig(slot_rule="random", terms=("passes",), step_clock="server")
    t = grid.compare(cfg, runs, {("none", 0.0): None}, {(False, 0.0): None})
    assert len(seen) == RANDOM_LAYOUTS == 5
    assert t.iloc[0]["sim_throughput_tok_s"] == pytest.approx(103.0)  # 101..105
    assert t.iloc[0]["sim_tpot_ms_mean"] == pytest.approx(30.0)
    draws = [[sl.rng.integers(1 << 30) for _ in range(3)] for sl in seen]
    assert len({tuple(d) for d in draws}) == 5
    again = grid.new_slots(cfg, None, 2).rng.integers(1 << 30, size=3).tolist()
    assert again == draws[2]


def test_per_run_arrival_seeds_draw_each_run_anew_and_score_over_the_same_seeds(monkeypatch):
    """``--arrival-seeds per-run``: run i of a cell (warm-ups counted) sends the jobs of seed
    + i, ``runs.csv`` keeps it, and the simulated cell is the median over its kept runs'
    seeds (the warm-up's left out); a grid measured before the seeds were kept is refused."""
    from specsim.errors import SpecsimError
    from specsim.fidelity.llama import grid

    cfg = LlamaValidationConfig(specs=("none",), concurrency=(), rates=(1.2,),
                                temperatures=(0.0,), target_ci=0.5, min_repeats=3,
                                max_repeats=3, warmup=1, seed=7,
                                arrival_seeds="per-run")  # fmt: skip
    sent = []

    def fake_run_cell(cfg, s, srv, inputs, trace, t, c, rate, seed=None):
        sent.append(seed)
        return {"spec": s.name, "temperature": t, "concurrency": c, "rate": rate,
                "throughput_tok_s": 50.0, "tpot_ms_mean": 20.0, "outputs_as_trace": 1.0,
                "arrival_seed": seed}  # fmt: skip

    monkeypatch.setattr(grid, "run_cell", fake_run_cell)
    rows = grid.interleaved_runs(cfg, {"none": "srv"}, None, {("none", 0.0): None}, lambda m: 0)
    assert sent == [7, 8, 9, 10] and [r["arrival_seed"] for r in rows] == sent
    simulated = []

    def fake_sim(cfg, s, trace, cost, c, rate, slots=None, seed=None):
        simulated.append(seed)
        return {"throughput_tok_s": float(seed or 0), "tpot_ms_mean": 10.0, "requests_completed": 8}

    monkeypatch.setattr(grid, "simulate_cell", fake_sim)
    base = {"requests": 12, "ttft_ms_mean": 1.0, "e2e_ms_mean": 2.0,
            "steady_throughput_tok_s": 1.0, "server_drafted": 0, "server_accepted": 0,
            "requests_counts_exact": 1.0}  # fmt: skip
    runs = pd.DataFrame([{**base, **r} for r in rows])
    t = grid.compare(cfg, runs, {("none", 0.0): None}, {(False, 0.0): None})
    assert sorted(simulated) == [8, 9, 10] and t.iloc[0]["sim_throughput_tok_s"] == 9.0
    simulated.clear()
    grid.compare(cfg.with_(arrival_seeds="fixed"), runs, {("none", 0.0): None},
                 {(False, 0.0): None})  # fmt: skip
    assert simulated == [None]  # the config's seed, as every grid before
    with pytest.raises(SpecsimError, match="rescore with --arrival-seeds fixed"):
        grid.compare(cfg, runs.drop(columns="arrival_seed"), {("none", 0.0): None},
                     {(False, 0.0): None})  # fmt: skip


def test_held_out_grid_is_disjoint_from_tuning_and_calibration():
    from specsim.fidelity.llama import held_out as h

    assert h.overlaps() == []
    import json
    from pathlib import Path

    committed = Path(__file__).parents[1] / "reports" / "llama-cpp" / "config.json"
    if committed.exists():  # TUNING is what the committed tuning grid ran
        conf = json.loads(committed.read_text())
        for k, v in h.TUNING.items():
            assert (tuple(conf[k]) if isinstance(v, tuple) else conf[k]) == v, k
    specs = h.runnable_specs()  # every setting, draft-dspark included, parses
    assert specs == ["none", "ngram:3", "ngram:7", "dspark:7", "dspark:4", "dspark:7:0.5"]
    d = h.HELD_OUT
    # the definition's drafter is the shipped v3, of the block size it states
    from specsim.record.draft_gguf import block_size, drafter_dir

    folder = drafter_dir(d["dspark"]["drafter"])
    assert folder.name == "dspark-v3-b179c9523d0e" and folder == drafter_dir("dspark-v3")
    assert block_size(folder) == d["dspark"]["block_size"] == 7
    assert max(d["concurrency"]) <= d["parallel"] and d["max_tokens"] == 64
    assert d["temperatures"] == (0.0, 1.0) and d["rates"] == (0.25,)
    assert d["grid_label"] == "held-out" and d["target_ci"] == 0.03
    assert d["min_repeats"] >= 3 and d["warmup"] >= 1  # the floor
    # sized for the 75 minutes at the fewest repeats the rule allows (the planning
    # estimate; the run's own minutes are the measurement)
    assert 30 < h.estimate_minutes() <= 75 < h.estimate_minutes(repeats=d["max_repeats"])


def test_held_out_command_parses_to_its_config():
    """The printed command, through validate's own parser, gives the definition's config."""
    import shlex

    from specsim.cli import build_parser
    from specsim.fidelity.llama import held_out as h
    from specsim.options import from_args

    line = h.command()
    assert "#" not in line  # nothing left out
    args = build_parser().parse_args(shlex.split(line)[1:])
    from pathlib import Path

    cfg = from_args(LlamaValidationConfig, args, seed=0, threads=args.server_threads)
    want = LlamaValidationConfig(**h.config_kwargs())
    assert cfg == want.with_(seed=0)
    assert cfg.out == Path("reports/llama-cpp-held-out")
    assert [s.name for s in cfg.settings if s.kind == "dspark"] == [
        "dspark:7", "dspark:4", "dspark:7:0.5",
    ]  # fmt: skip
    assert cfg.dspark_drafter == h.HELD_OUT["dspark"]["drafter"]


def test_the_docs_give_the_held_out_grid_s_own_command():
    """docs/llama-cpp.md prints the command that runs the held-out grid; it must be the
    definition's (a hand-edited copy could run another grid)."""
    from pathlib import Path

    from specsim.fidelity.llama import held_out as h

    doc = (Path(__file__).parents[1] / "docs" / "llama-cpp.md").read_text()
    assert h.command() in doc


def _check_v4_held_out(d, earlier, runs, tuned_run, same, calibrated=()):  # noqa: ANN001
    """A v4 held-out grid's definition: no overlap with ``earlier`` (which holds what every
    run of ``runs`` ran) but the ``calibrated`` loads (only ever calibration loads), the
    ``same`` fields as ``tuned_run``'s config, the servers' own drafts and clock, sized for
    the issue's time, and its command (through validate's parser) its config and the one the
    plan prints."""
    import json
    import shlex
    from pathlib import Path

    from specsim.cli import build_parser
    from specsim.fidelity.llama import held_out as h
    from specsim.options import from_args

    reports = Path(__file__).parents[1] / "reports" / "llama-cpp-v4"
    assert [o for o in h.overlaps(d, earlier) if o not in calibrated] == []
    for run in runs:
        conf = json.loads((reports / run / "config.json").read_text())
        for k in ("concurrency", "calib_concurrency", "rates"):
            assert set(conf[k]) <= set(earlier[k]), (run, k)
        assert conf["calib_prompts"] == d["calib_prompts"]  # the method's calibration
    tuned = json.loads((reports / tuned_run / "config.json").read_text())
    for k in same:
        assert (tuple(tuned[k]) if isinstance(d[k], tuple) else tuned[k]) == d[k], k
    assert (d["step_clock"], d["dspark_trace"], d["ngram_trace"]) == ("server",) * 3
    assert d["grid_label"] == "held-out" and d["temperatures"] == (0.0, 1.0)
    assert h.estimate_minutes(d, h.TOK_S_V4, repeats=d["max_repeats"]) <= 60  # + recording
    line = h.command(d)
    args = build_parser().parse_args(shlex.split(line)[1:])
    cfg = from_args(LlamaValidationConfig, args, seed=0, threads=args.server_threads)
    assert cfg == LlamaValidationConfig(**h.config_kwargs(d)).with_(seed=0)
    assert line in (reports / "PLAN.md").read_text()


def test_the_v4_held_out_grid_is_new_and_fixed_before_it_runs():
    """Issue 66's held-out grid: prompts, a closed loop and a rate no earlier grid or
    calibration of the method ran; the tuning runs' servers and frozen method (terms, the
    server's clock, the servers' own drafts); sized for 75 minutes at the most repeats; its
    command, through validate's parser, is its config and is the one the plan prints."""
    from specsim.fidelity.llama import held_out as h

    same = ("specs", "terms", "target_type", "parallel", "max_tokens", "calib_concurrency")
    _check_v4_held_out(h.HELD_OUT_V4, h.EARLIER_V4, ("tuning", "tuning-2", "tuning-3"),
                       "tuning-3", same)  # fmt: skip


def test_the_second_v4_held_out_grid_is_new_and_fixed_before_it_runs():
    """The second held-out grid (PLAN.md step 6): prompts, a closed loop and a rate no earlier
    grid or calibration ran, the first held-out grid's included; the tuning runs' servers and
    settings, the model the fourth tuning run's rule kept (terms and calibration loads); sized
    like the first; its command is its config and the one the plan prints."""
    from specsim.fidelity.llama import held_out as h

    runs = ("tuning", "tuning-2", "tuning-3", "tuning-4", "held-out")
    same = ("specs", "terms", "target_type", "parallel", "max_tokens", "calib_concurrency")
    _check_v4_held_out(h.HELD_OUT_V5, h.EARLIER_V5, runs, "tuning-4", same)


def test_the_third_v4_held_out_grid_is_new_and_fixed_before_it_runs():
    """The third held-out grid (PLAN.md step 8): prompts, a closed loop and a rate no earlier
    grid ran (both held-out grids included; C = 6 was only ever a calibration load, on other
    prompts), the tuning runs' servers and settings, the model step 7's rule kept (`passes`
    and `pass_extra`, the lowest free slots); its command is its config and the plan's."""
    from specsim.fidelity.llama import held_out as h

    d = h.HELD_OUT_V6
    runs = ("tuning", "tuning-2", "tuning-3", "tuning-4", "held-out", "held-out-2")
    same = ("specs", "target_type", "parallel", "max_tokens", "calib_concurrency")
    _check_v4_held_out(d, h.EARLIER_V6, runs, "tuning-4", same, calibrated=("C=6",))
    assert not set(d["concurrency"]) & set(h.EARLIER_V6["concurrency"])
    assert d["terms"] == ("drafter_request", "passes", "pass_extra")


def test_the_fourth_v4_held_out_grid_is_new_and_fixed_before_it_runs():
    """The fourth held-out grid (PLAN.md step 10): new prompts, a rate no earlier grid or
    calibration ran, C = 5 (every level the slots allow has run somewhere; 5 only in the v3
    grid, never in v4), the tuning runs' servers and settings, the model step 9's rule kept
    (`no_context` added, not `by_kind`; the lowest free slots)."""
    from specsim.fidelity.llama import held_out as h

    d = h.HELD_OUT_V7
    runs = ("tuning", "tuning-2", "tuning-3", "tuning-4", "held-out", "held-out-2", "held-out-3")
    same = ("specs", "target_type", "parallel", "max_tokens", "calib_concurrency")
    _check_v4_held_out(d, h.EARLIER_V7, runs, "tuning-4", same, calibrated=("C=5",))
    v4_loads = {*h.EARLIER_V7["calib_concurrency"], 1, 4, 3, 7, 6}  # v4 tuning, grids, calib
    assert not set(d["concurrency"]) & v4_loads
    assert not set(d["rates"]) & set(h.EARLIER_V7["rates"])
    assert d["terms"] == ("drafter_request", "passes", "pass_extra", "no_context")


def test_the_fifth_v4_held_out_grid_is_new_and_fixed_before_it_runs():
    """The fifth held-out grid (PLAN.md step 13): new prompts, a rate no earlier grid or
    calibration ran, C = 8 (in v4 never a grid's or a calibration's load; only the v3 grid's),
    the tuning runs' servers and settings, the model step 12's rule kept (the context term
    back, one table, a seeded random free slot)."""
    from specsim.fidelity.llama import held_out as h

    d = h.HELD_OUT_V8
    runs = ("tuning", "tuning-2", "tuning-3", "tuning-4", "tuning-5", "held-out", "held-out-2",
            "held-out-3", "held-out-4")  # fmt: skip
    same = ("specs", "target_type", "parallel", "max_tokens", "calib_concurrency")
    _check_v4_held_out(d, h.EARLIER_V8, runs, "tuning-5", same, calibrated=("C=8",))
    v4_loads = {*h.EARLIER_V8["calib_concurrency"], 1, 4, 3, 7, 6, 5}  # v4 tuning, grids, calib
    assert not set(d["concurrency"]) & v4_loads
    assert not set(d["rates"]) & set(h.EARLIER_V8["rates"])
    assert d["terms"] == ("drafter_request", "passes", "pass_extra")
    assert d["slot_rule"] == "random" and max(d["concurrency"]) == d["parallel"]


def test_the_sixth_v4_held_out_grid_is_new_and_fixed_before_it_runs():
    """The sixth held-out grid (PLAN.md step 16): new prompts (GSM8K questions no run saw and
    standard-library stubs), a rate no earlier grid or calibration ran, C = 2 (a calibration
    load, never a v4 grid's), the tuning runs' servers and settings, the model step 15's rule
    kept (the server's slot rule with history, the context term, every run its own draw)."""
    from specsim.fidelity.llama import held_out as h

    d = h.HELD_OUT_V9
    runs = ("tuning", "tuning-2", "tuning-3", "tuning-4", "tuning-5", "tuning-6", "held-out",
            "held-out-2", "held-out-3", "held-out-4", "held-out-5")  # fmt: skip
    same = ("specs", "target_type", "parallel", "max_tokens", "calib_concurrency", "terms",
            "arrival_seeds")  # fmt: skip
    _check_v4_held_out(d, h.EARLIER_V9, runs, "tuning-6", same, calibrated=("C=2",))
    v4_grid_loads = {1, 4, 3, 7, 6, 5, 8}  # v4 tuning runs' and held-out grids' closed loops
    assert not set(d["concurrency"]) & v4_grid_loads
    assert not set(d["rates"]) & set(h.EARLIER_V9["rates"])
    assert d["terms"] == ("drafter_request", "passes", "pass_extra")
    assert (d["slot_rule"], d["arrival_seeds"]) == ("llama-server-history", "per-run")


def test_the_seventh_v4_held_out_grid_is_new_and_fixed_before_it_runs():
    """The seventh held-out grid (PLAN.md step 19): new prompts (the next GSM8K questions and
    other standard-library stubs), a rate no earlier grid or calibration ran, C = 3 (only the
    first v4 grid's, on other prompts), the tuning runs' servers and settings, the model step
    18's rule kept (a table per kind of server, random free slots, every run its own draw)."""
    from specsim.fidelity.llama import held_out as h

    d = h.HELD_OUT_V10
    runs = ("tuning", "tuning-2", "tuning-3", "tuning-4", "tuning-5", "tuning-6", "held-out",
            "held-out-2", "held-out-3", "held-out-4", "held-out-5", "held-out-6")  # fmt: skip
    same = ("specs", "target_type", "parallel", "max_tokens", "calib_concurrency",
            "arrival_seeds")  # fmt: skip
    _check_v4_held_out(d, h.EARLIER_V10, runs, "tuning-6", same, calibrated=("C=3",))
    assert not set(d["rates"]) & set(h.EARLIER_V10["rates"])
    assert d["terms"] == ("drafter_request", "passes", "pass_extra", "by_kind")
    assert (d["slot_rule"], d["arrival_seeds"]) == ("random", "per-run")


def test_the_eighth_v4_held_out_grid_is_new_and_fixed_before_it_runs():
    """The eighth held-out grid (PLAN.md step 20): new prompts (the next GSM8K questions and
    stubs from other standard-library modules), a rate no earlier grid or calibration ran,
    C = 5 (only the fourth held-out grid's, on other prompts under an older model), the
    seventh grid's servers, settings and model, and the drift probe between its rounds."""
    from specsim.fidelity.llama import held_out as h

    d = h.HELD_OUT_V11
    runs = ("tuning", "tuning-2", "tuning-3", "tuning-4", "tuning-5", "tuning-6", "held-out",
            "held-out-2", "held-out-3", "held-out-4", "held-out-5", "held-out-6",
            "held-out-7")  # fmt: skip
    same = ("specs", "target_type", "parallel", "max_tokens", "calib_concurrency",
            "arrival_seeds", "terms", "slot_rule")  # fmt: skip
    _check_v4_held_out(d, h.EARLIER_V11, runs, "held-out-7", same, calibrated=("C=5",))
    assert not set(d["rates"]) & set(h.EARLIER_V11["rates"])
    assert d["drift_probe"] == 4 and d["target_ci"] is not None and "none" in d["specs"]


def test_the_ninth_v4_held_out_grid_is_new_and_fixed_before_it_runs():
    """The ninth held-out grid (PLAN.md step 21): new prompts, a rate no earlier grid or
    calibration ran, C = 7 (only the second held-out grid's, on other prompts under an older
    model), held-out-8's servers, settings, model and probe, and the calibration in passes
    between the rounds."""
    from specsim.fidelity.llama import held_out as h

    d = h.HELD_OUT_V12
    runs = ("tuning", "tuning-2", "tuning-3", "tuning-4", "tuning-5", "tuning-6", "held-out",
            "held-out-2", "held-out-3", "held-out-4", "held-out-5", "held-out-6",
            "held-out-7", "held-out-8")  # fmt: skip
    same = ("specs", "target_type", "parallel", "max_tokens", "calib_concurrency",
            "arrival_seeds", "terms", "slot_rule", "drift_probe")  # fmt: skip
    _check_v4_held_out(d, h.EARLIER_V12, runs, "held-out-8", same, calibrated=("C=7",))
    assert not set(d["rates"]) & set(h.EARLIER_V12["rates"])
    assert (d["calib_schedule"], d["calib_requests"]) == ("rounds", 1.0)


def test_the_tenth_v4_held_out_grid_is_new_and_fixed_before_it_runs():
    """The tenth held-out grid (PLAN.md step 22): new prompts, a rate no earlier grid or
    calibration ran, C = 8 (only the fifth held-out grid's, on other prompts under an older
    model), and held-out-9's servers, settings, model, probe and calibration schedule."""
    from specsim.fidelity.llama import held_out as h

    d = h.HELD_OUT_V13
    runs = ("tuning", "tuning-2", "tuning-3", "tuning-4", "tuning-5", "tuning-6", "held-out",
            "held-out-2", "held-out-3", "held-out-4", "held-out-5", "held-out-6",
            "held-out-7", "held-out-8", "held-out-9")  # fmt: skip
    same = ("specs", "target_type", "parallel", "max_tokens", "calib_concurrency",
            "calib_requests", "calib_schedule", "arrival_seeds", "terms", "slot_rule",
            "drift_probe")  # fmt: skip
    _check_v4_held_out(d, h.EARLIER_V13, runs, "held-out-9", same, calibrated=("C=8",))
    assert not set(d["rates"]) & set(h.EARLIER_V13["rates"])


def test_the_eleventh_v4_held_out_grid_is_new_and_fixed_before_it_runs():
    """The eleventh held-out grid (PLAN.md step 23): new prompts, a rate no earlier grid or
    calibration ran, C = 6 (only the third held-out grid's, on other prompts under an older
    model), held-out-10's servers, settings, model, probe and calibration schedule, and each
    trace recorded five times (one draw per kept run)."""
    from specsim.fidelity.llama import held_out as h

    d = h.HELD_OUT_V14
    runs = ("tuning", "tuning-2", "tuning-3", "tuning-4", "tuning-5", "tuning-6", "held-out",
            "held-out-2", "held-out-3", "held-out-4", "held-out-5", "held-out-6",
            "held-out-7", "held-out-8", "held-out-9", "held-out-10")  # fmt: skip
    same = ("specs", "target_type", "parallel", "max_tokens", "calib_concurrency",
            "calib_requests", "calib_schedule", "arrival_seeds", "terms", "slot_rule",
            "drift_probe", "open_requests", "min_repeats", "max_repeats")  # fmt: skip
    _check_v4_held_out(d, h.EARLIER_V14, runs, "held-out-10", same, calibrated=("C=6",))
    assert not set(d["rates"]) & set(h.EARLIER_V14["rates"])
    assert d["trace_draws"] == d["max_repeats"] == 5
