"""``specsim validate`` and ``specsim engine`` end to end on a tiny random target (the CI grid:
seconds), their refusals, and the pure comparison helpers."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest
from record_tiny import prompts_file, tiny_dir

pytest.importorskip("torch")

from specsim.cli import main  # noqa: E402
from specsim.errors import SpecsimError  # noqa: E402
from specsim.fidelity.config import parse_grid  # noqa: E402
from specsim.fidelity.metrics import METRICS, compare  # noqa: E402
from specsim.sim.cost_profiles import parse_curve, read_profile_csv  # noqa: E402

# simulated / real timing allowed on the tiny model (steps of ~2 ms), either way: loose on
# purpose, see test_cpu_clock_timing_within_a_loose_bound. Seen: here 0.53x (sim too fast), on a
# loaded CI host 2.44x (sim TPOT too slow: the profile's 2-ms steps timed beside a neighbour on
# the sibling hyperthread); a unit slip (ms for s) would be 1000x
TINY_FACTOR = 4.0


def assert_within_factor(table: pd.DataFrame, factor: float = TINY_FACTOR) -> None:
    """Every cell's simulated throughput and mean TPOT within ``factor`` of the real one."""
    for m in ("throughput_tok_s", "tpot_ms_mean"):
        ratio = 1.0 + table[f"err_{m}"]  # err = (sim - real) / real
        assert (ratio > 0).all() and (np.abs(np.log(ratio)) < np.log(factor)).all(), table[
            ["policy", "load", f"err_{m}"]
        ]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("validate")
    return {
        "dir": d,
        "target": str(tiny_dir(d / "tiny")),
        "prompts": str(prompts_file(d / "p.jsonl", 6)),
    }


def base_args(s, out, trace, *extra):
    return [
        "validate", "--target", s["target"], "--drafter", "ngram", "--trace", str(trace),
        "--prompts", s["prompts"], "--max-new-tokens", "20", "--contexts", "64",
        "--profile-repeats", "2", "--clock", "cpu", "--out", str(out), *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def report(setup):
    out = setup["dir"] / "rep"
    trace = setup["dir"] / "t.parquet"
    rc = main(
        base_args(
            setup,
            out,
            trace,
            "--policies",
            "ar,full,hw-aware",
            "--concurrency",
            "1,3",
            "--rates",
            "0.5",
            "--repeats",
            "2",
            "--open-repeats",
            "1",
        )  # fmt: skip
    )
    assert rc == 0
    return out, trace


@pytest.mark.slow  # fast suite under 5 min: over 2.8 s alone (CI runs it)
def test_grid_table_is_complete(report):
    out, _ = report
    table = pd.read_csv(out / "fidelity.csv")
    assert len(table) == 9  # 3 policies x (C = 1, 3 and one open-loop rate)
    assert set(zip(table.policy, table.load, strict=True)) == {
        (p, c) for p in ("ar", "full", "hw-aware") for c in ("C=1", "C=3", "rate=0.5x")
    }
    assert (table.loc[table.concurrency > 0, "repeats"] == 2).all()
    assert (table.loc[table.concurrency < 0, "repeats"] == 1).all()
    runs = pd.read_csv(out / "runs.csv")
    assert len(runs) == 6 * 2 + 3
    for m in METRICS:
        assert np.all(np.isfinite(table[f"real_{m}"])) and np.all(table[f"real_{m}"] > 0)
        want = (table[f"sim_{m}"] - table[f"real_{m}"]) / table[f"real_{m}"]
        assert np.allclose(table[f"err_{m}"], want, rtol=1e-3, atol=1e-4)  # CSV keeps 6 digits


def test_greedy_replay_matches_the_engine_exactly(report):
    """Same prompts, drafter and policy at T = 0: the simulator's tau and output lengths are
    the engine's (only timing may differ)."""
    table = pd.read_csv(report[0] / "fidelity.csv")
    assert (table["length_mismatch"] == 0).all()
    closed = table[table.concurrency > 0]
    assert np.allclose(closed["real_tau"], closed["sim_tau"], rtol=1e-9)
    # open loop: which requests share a step depends on the clock, so a load-dependent policy
    # may verify differently; the outputs stay the target's greedy decoding
    assert np.allclose(table["real_tau"], table["sim_tau"], rtol=0.15)
    assert (table.loc[table.policy == "ar", "real_tau"] == 1.0).all()
    assert (table.loc[table.policy == "full", "real_tau"] > 1.0).all()


def test_cpu_clock_timing_within_a_loose_bound(report):
    """The CI grid is seconds on a tiny model (steps of ~2 ms, where Python overheads the
    profile only samples dominate): the timing error is checked against a loose bound only;
    the real bound is the committed report's. Within a factor of 4 either way: the profile's
    per-request terms are differences of ~1 ms medians here, and a 2-ms step's CPU time doubles
    beside a busy sibling hyperthread, so the profile and the runs can be timed at different
    speeds (a unit slip would be 1000x)."""
    table = pd.read_csv(report[0] / "fidelity.csv")
    assert_within_factor(table)
    closed = table[table.concurrency > 0]
    assert closed["wall_err_throughput_tok_s"].notna().all()  # both clocks for closed loops
    assert table.loc[table.concurrency < 0, "wall_err_throughput_tok_s"].isna().all()


def test_hog_check_runs_the_cell_beside_hogs(setup):
    """The hog check: one run quiet, beside a CPU spinner, beside a memory streamer."""
    from specsim.fidelity.config import RunSpec, parse_grid
    from specsim.fidelity.real import hog_check
    from specsim.fidelity.real import init_worker as _init_worker
    from specsim.sim.cost_profiles import get_profile

    _init_worker(setup["target"], ["ngram"], "cpu", 1)
    prompts = [[5 + (i * 7 + k) % 80 for k in range(6 + i)] for i in range(4)]
    cell = parse_grid("mtp1", "2")[0]
    spec = RunSpec(
        cell=cell.__class__(cell.policy, 2, None, "ngram"), repeat=0, jobs=4, rate=None, seed=0,
        clock="cpu", layout="flat", prefill_budget=256, kv_tokens=1 << 20,
        cost=get_profile("h100-dense-8b"), prompt_ids=prompts,
        prompt_len=np.array([len(p) for p in prompts]), output_len=np.full(4, 8),
    )  # fmt: skip
    df = hog_check(spec, 1)
    assert list(df["condition"].unique()) == ["quiet", "cpu hog", "memory hog"]
    assert set(df["hog_processes"]) == {0, 1}
    assert np.all(np.isfinite(df["throughput_tok_s"])) and (df["throughput_tok_s"] > 0).all()
    assert (df.loc[df.condition == "quiet", "throughput_vs_quiet"] == 0).all()


def test_term_ablation_scores_each_term(report):
    """terms.csv: every cell replayed under each profile variant; the full model reproduces
    the grid's own simulated side, and each variant differs from it only in the term removed."""
    out, _ = report
    terms = pd.read_csv(out / "terms.csv")
    table = pd.read_csv(out / "fidelity.csv")
    # the full model, the three terms and v1, the draft curve's line, the overhead's v3 split,
    # residual and v2 line
    # (and v5's loop at 4 tokens a request when the per-token term came out above 0)
    n_var = 9 + bool(read_profile_csv(out / "profile-ngram.csv").accept_per_token_ms)
    assert terms["variant"].nunique() == n_var
    assert len(terms) == n_var * len(table)
    full = terms[terms.variant == "full model"].reset_index(drop=True)
    np.testing.assert_allclose(full["err_throughput_tok_s"], table["err_throughput_tok_s"],
                               rtol=1e-4, atol=1e-5)  # fmt: skip
    v1 = terms[terms.variant.str.startswith("v1")]
    assert not np.allclose(v1["err_throughput_tok_s"], full["err_throughput_tok_s"])
    assert "What each cost term bought" in (out / "README.md").read_text()


def test_report_files(report):
    out, trace = report
    assert trace.exists()
    for name in ("README.md", "fidelity.png", "engine_steps.parquet", "config.json",
                 "decomposition.csv", "runs.csv", "requests.parquet"):  # fmt: skip
        assert (out / name).exists(), name
    cost = read_profile_csv(out / "profile-ngram.csv")
    assert cost.b_max >= 64 and cost.draft_per_request_ms >= 0
    assert cost.meta["clock"] == "cpu" and cost.prefill_token_ms > 0
    # drafting at each R as the engine spent it (its calibration runs)
    per = pd.read_csv(out / "profile-ngram-per-request.csv")
    assert (per["steps"] >= 2).all()
    assert [r for r, _ in cost.draft_curve] == per["requests"].tolist()
    assert [r for r, _ in cost.overhead_curve] == per["requests"].tolist()
    # the overhead: the forward's per-request split plus the loop's own timers
    want = per["verify_extra_ms"].clip(lower=0) + per["loop_ms"].clip(lower=0)
    np.testing.assert_allclose([m for _, m in cost.overhead_curve], want, atol=1e-3)
    assert all(m >= 0 for _, m in cost.draft_curve) and "overhead_engine_curve" in cost.meta
    # the loop's per-token part, fitted over both calibration passes (4 and gamma + 1 tokens a
    # request), and v5's form (the loop at 4 tokens a request) kept for the ablation
    assert cost.accept_per_token_ms >= 0 and (per["loop_k4_ms"] >= 0).all()
    k4 = per["verify_extra_ms"].clip(lower=0) + per["loop_k4_ms"].clip(lower=0)
    np.testing.assert_allclose(
        [m for _, m in parse_curve(cost.meta["overhead_k4_curve"], "k4")], k4, atol=1e-3
    )
    twin = read_profile_csv(out / "profile-ngram-wall.csv")
    assert twin.meta["clock"] == "wall" and twin.is_2d == cost.is_2d
    steps = pd.read_parquet(out / "engine_steps.parquet")
    assert {
        "policy",
        "concurrency",
        "time_s",
        "batch_tokens",
        "accepted_drafts",
        "draft_s",
        "verify_s",
    } <= set(steps.columns)
    assert "| ngram | hw-aware | C=3 |" in (out / "README.md").read_text()
    # every request's timeline, real (each repeat) and simulated (repeat -1), per cell
    req = pd.read_parquet(out / "requests.parquet")
    table = pd.read_csv(out / "fidelity.csv")
    for r in table.itertuples():
        cell = req[(req.policy == r.policy) & (req.load == r.load)]
        assert (cell.side == "real").sum() == r.jobs * r.repeats, r
        sim = cell[cell.side == "sim"]
        assert len(sim) == r.jobs and (sim.repeat == -1).all()
    np.testing.assert_allclose(req.ttft_ms, 1000 * (req.first_token_s - req.arrival_s), rtol=1e-9)
    assert (req.admitted_s >= req.arrival_s).all() and (req.first_token_s > req.admitted_s).all()
    assert json.loads((out / "config.json").read_text())["drafter"] == "ngram:3"


def test_refuses_to_overwrite_without_force(report, setup, capsys):
    out, trace = report
    rc = main(base_args(setup, out, trace, "--policies", "ar", "--concurrency", "1"))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "--force" in err[0]


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--policies", "no-such-policy"], "no-such-policy"),
        (["--concurrency", "1,x"], "--concurrency"),
        (["--drafter", "ngram:2"], "drafter"),  # the trace was recorded with ngram:3
    ],
)
def test_bad_input_is_one_line(report, setup, capsys, extra, needle):
    _, trace = report
    rc = main(base_args(setup, setup["dir"] / "other", trace, *extra))
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and needle in err[0], err


def test_engine_command_writes_logs(setup, capsys):
    out = setup["dir"] / "eng"
    args = ["engine", "--target", setup["target"], "--drafter", "ngram", "--prompts",
            setup["prompts"], "--policy", "full", "--concurrency", "2", "--max-new-tokens",
            "12", "--profile", "h100-dense-8b", "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["requests_completed"] == 6 and summary["tau"] > 1.0
    steps = pd.read_parquet(out / "steps.parquet")
    assert int(steps["emitted_tokens"].sum()) == summary["output_tokens"]
    assert len(pd.read_parquet(out / "requests.parquet")) == 6
    assert sum(1 for _ in open(out / "outputs.jsonl")) == 6
    assert main(args) == 2  # no overwrite without --force
    assert "--force" in capsys.readouterr().err


def test_compare_and_grid_helpers():
    real = dict.fromkeys(METRICS, 10.0)
    sim = dict.fromkeys(METRICS, 11.0)
    row = compare(real, sim)
    assert row["err_tau"] == pytest.approx(0.1) and row["sim_tpot_ms_mean"] == 11.0
    cells = parse_grid("ar, full", "1,4")
    assert [(c.policy, c.concurrency) for c in cells] == [
        ("ar", 1),
        ("ar", 4),
        ("full", 1),
        ("full", 4),
    ]
    with pytest.raises(SpecsimError):
        parse_grid("ar", "0")


@pytest.mark.slow  # fast suite under 5 min: over 2.8 s alone (CI runs it)
def test_ref_clock_grid(report, setup):
    """The CI grid on the reference clock (issue 15, section 4): 2 policies x C = 1, 2 plus the
    hog check; tau and lengths exact, timing within a loose bound, the profile and every run
    in the reference's units, each run's speed factor and the probes' reference kept."""
    out = setup["dir"] / "rep-ref"
    _, trace = report
    args = base_args(setup, out, trace, "--policies", "ar,full", "--concurrency", "1,2")
    args[args.index("--clock") + 1] = "ref"
    assert main([*args, "--hog-check"]) == 0
    table = pd.read_csv(out / "fidelity.csv")
    assert len(table) == 4 and (table["length_mismatch"] == 0).all()
    assert np.allclose(table["real_tau"], table["sim_tau"], rtol=1e-9)
    assert_within_factor(table)
    runs = pd.read_csv(out / "runs.csv")
    assert "ref_throughput_tok_s" in runs and np.all(np.isfinite(runs["speed_factor"]))
    assert ((runs["speed_factor"] > 0.2) & (runs["speed_factor"] < 5)).all()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["clock"] == "ref" and cfg["speed_probe"] == "cold"  # the defaults since v7
    assert set(cfg["speed_reference_ms"]) == {"target", "target:large", "draft:ngram"}
    assert cfg["speed_probe_tokens"] == {"target": 4, "target:large": 64}
    assert cfg["speed_large_every"] == 4 and cfg["speed_large_ratio_last"] > 0
    phases = cfg["phases_s"]  # where the grid's time went, in the order it went there
    assert list(phases)[:3] == ["loading the models", "speed reference", "traces and profiles"]
    assert "hog check" in phases and list(phases)[-1] == "4 real runs"  # 4 cells, 1 repeat
    assert min(phases.values()) >= 0 and sum(phases.values()) <= cfg["elapsed_s"] + 0.5
    assert "4 real runs" in (out / "README.md").read_text()
    assert read_profile_csv(out / "profile-ngram.csv").meta["clock"] == "ref"
    hog = pd.read_csv(out / "hog.csv")
    assert set(hog["clock"]) == {"ref", "cpu", "wall"}
    assert "ref clock" in (out / "README.md").read_text()


@pytest.mark.slow  # fast suite under 5 min: over 2.8 s alone (CI runs it)
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="two workers need two cores")
def test_two_workers_on_the_ref_clock(report, setup):
    """``--workers 2``: the runs in two spawned processes, each with the parent's reference;
    greedy lengths and tau still exact, timing within the loose bound, every run's speed factor
    its own worker's, and the workers' re-timings counted in config.json."""
    out = setup["dir"] / "rep-workers"
    _, trace = report
    args = base_args(setup, out, trace, "--policies", "ar,full", "--concurrency", "1,2")
    args[args.index("--clock") + 1] = "ref"
    assert main([*args, "--repeats", "2", "--workers", "2"]) == 0
    table = pd.read_csv(out / "fidelity.csv")
    assert len(table) == 4 and (table["length_mismatch"] == 0).all()
    assert np.allclose(table["real_tau"], table["sim_tau"], rtol=1e-9)
    assert_within_factor(table)
    runs = pd.read_csv(out / "runs.csv")
    assert len(runs) == 8 and ((runs["speed_factor"] > 0.2) & (runs["speed_factor"] < 5)).all()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["workers"] == 2 and cfg["speed_calibrations"] >= 8  # one at each run's start
    assert "2 at a time" in (out / "README.md").read_text()


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (("--workers", "0"), "--workers must be between 1"),
        (("--workers", "2"), "needs --clock ref"),
    ],
)
def test_workers_refusals(report, setup, capsys, extra, needle):
    _, trace = report
    rc = main(base_args(setup, setup["dir"] / "rep-bad-workers", trace, *extra))
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and "Traceback" not in err


@pytest.mark.slow  # fast suite under 5 min: over 2.8 s alone (CI runs it)
def test_shared_table_is_timed_once_and_reused(setup):
    """--shared-table (the default): the second drafter's profile reuses the first one's step
    table and prefill points (the same rows, bit for bit) while its drafting terms are its
    own."""
    out = setup["dir"] / "shared"
    trace = setup["dir"] / "t-{drafter}.parquet"
    args = base_args(setup, out, trace, "--policies", "ar", "--concurrency", "1")
    args[args.index("--drafter")] = "--drafters"
    args[args.index("--drafters") + 1] = "ngram,ngram:2"
    assert main(args) == 0
    a = pd.read_csv(out / "profile-ngram-points.csv")
    b = pd.read_csv(out / "profile-ngram2-points.csv")
    pd.testing.assert_frame_equal(a, b)
    ta = pd.read_csv(out / "profile-ngram-terms.csv")
    tb = pd.read_csv(out / "profile-ngram2-terms.csv")
    pre = ta.term == "prefill"
    pd.testing.assert_frame_equal(ta[pre], tb[tb.term == "prefill"])
    assert json.loads((out / "config.json").read_text())["profile_table"] == (
        "shared by the drafters"
    )


def test_a_reused_table_must_match():
    """A table of other contexts (or clock) is refused before anything is timed."""
    from specsim.sim.cost import CostModel
    from specsim.torch_engine.cost_calibration import EngineProfile, measure_profile

    steps = pd.DataFrame({"context_tokens": [32, 32], "batch_tokens": [1, 2],
                          "step_ms": [1.0, 1.5]})  # fmt: skip
    cost = CostModel("t", np.array([1, 2]), np.array([1.0, 1.5]), meta={"clock": "cpu"})
    prof = EngineProfile(cost=cost, steps=steps, per_request=None, prefill_points=[(32, 2, 2)])
    with pytest.raises(SpecsimError, match="same contexts"):
        measure_profile(None, None, None, name="x", batch_tokens=(1, 2), contexts=(64,),
                        prefill_tokens=(32,), clock="cpu", table=prof)  # fmt: skip
    with pytest.raises(SpecsimError, match="same contexts"):
        measure_profile(None, None, None, name="x", batch_tokens=(1, 2), contexts=(32,),
                        prefill_tokens=(32,), clock="wall", table=prof)  # fmt: skip
