"""Streaming results (issue 50): the DDSketch's stated error, merging, exact sums, and the
streamed summary against the whole-run one on every shipped trace.

- ``DDSketch.quantile(q, "lower")`` is within alpha (relative) of ``np.quantile(x, q,
  method="lower")``, and ``quantile(q)`` within alpha of ``np.quantile(x, q)`` for values of
  one sign (the interpolation of two estimates each within alpha), property-tested;
- a merged sketch is the sketch of the union, bucket for bucket;
- ``ExactSum`` is ``math.fsum`` of everything added, however it is batched;
- ``replay(stream=True)``: every count, mean, share and goodput bit-identical to the whole-run
  summary (percentiles too while the rows are kept), and with the sketch forced
  (``stream_exact_rows=0``) every percentile within alpha of the exact one, on every trace
  under ``specsim/data/traces/``; the streamed Parquet table is the whole-run table.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from specsim.errors import SpecsimError
from specsim.sim.simulate import replay
from specsim.sim.sketch import DDSketch
from specsim.sim.streaming import (
    ExactSum,
    Finished,
    ParquetRows,
    StreamConfig,
    StreamingSummary,
)

ALPHA = 0.005
SLACK = 1e-12  # the rounded logarithm at a bucket edge (module docstring of sim.sketch)
TRACES = sorted(
    (Path(__file__).resolve().parents[1] / "specsim" / "data" / "traces").glob("*.parquet")
)
WALL_KEYS = ("wall_time_s", "sim_tokens_per_wall_s")
# the summary keys a sketch estimates (every other key is exact in a streamed run)
PCT_KEYS = ("per_user_tps_p50",) + tuple(
    f"{m}_ms_p{q}" for m in ("ttft", "tpot", "e2e") for q in (50, 90, 95, 99)
)

finite = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False, allow_infinity=False)
positive = st.floats(min_value=1e-9, max_value=1e9, allow_nan=False, allow_infinity=False)
values = st.lists(st.one_of(finite, st.just(0.0), st.just(float("nan"))), min_size=1, max_size=300)
quantile = st.floats(min_value=0.0, max_value=1.0)


def _bits_equal(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


# ---------------------------------------------------------------- the sketch


@given(values, quantile)
def test_lower_quantile_within_alpha_of_the_order_statistic(xs, q):
    x = np.array(xs)
    s = DDSketch(ALPHA)
    s.add(x)
    f = x[np.isfinite(x)]
    assert s.count == f.size and s.skipped == x.size - f.size
    if f.size == 0:
        assert math.isnan(s.quantile(q))
        return
    exact = float(np.quantile(f, q, method="lower"))  # x_(floor(q (n - 1)))
    est = s.quantile(q, "lower")
    assert abs(est - exact) <= ALPHA * abs(exact) * (1 + SLACK)


@given(st.lists(st.one_of(positive, st.just(0.0)), min_size=1, max_size=300), quantile)
def test_linear_quantile_within_alpha_of_numpys_percentile(xs, q):
    """One sign (latencies, rates): within alpha of np.percentile's linear interpolation."""
    x = np.array(xs)
    s = DDSketch(ALPHA)
    s.add(x)
    exact = float(np.percentile(x, 100 * q))
    assert abs(s.percentile(100 * q) - exact) <= ALPHA * abs(exact) * (1 + SLACK)


@given(st.lists(finite, min_size=2, max_size=200), quantile)
def test_linear_quantile_bound_with_mixed_signs(xs, q):
    """Mixed signs: within alpha of the two neighbours' magnitudes, interpolated."""
    x = np.sort(np.array(xs))
    s = DDSketch(ALPHA)
    s.add(x)
    h = q * (x.size - 1)
    lo, hi = int(math.floor(h)), min(int(math.floor(h)) + 1, x.size - 1)
    f = h - math.floor(h)
    bound = ALPHA * ((1 - f) * abs(x[lo]) + f * abs(x[hi])) * (1 + SLACK)
    assert abs(s.quantile(q) - float(np.quantile(x, q))) <= bound + 1e-300


def test_sketch_edges_and_alpha():
    s = DDSketch()
    assert math.isnan(s.quantile(0.5)) and len(s) == 0
    s.add(np.array([np.nan, np.inf, -np.inf]))
    assert s.skipped == 3 and s.count == 0 and math.isnan(s.percentile(99))
    s.add(np.array([0.0, 0.0, 5.0]))
    assert s.quantile(0.0) == 0.0 and s.quantile(1.0) == 5.0  # clamped to the min and max
    big = DDSketch(0.05)
    big.add(np.array([1e-300, 1e300, 5e-324, 1.7e308]))  # the whole double range indexes
    assert abs(big.quantile(1.0) - 1.7e308) <= 0.05 * 1.7e308
    for a in (0.0, 1.0, -0.1, float("nan")):
        with pytest.raises(ValueError):
            DDSketch(a)
    with pytest.raises(ValueError, match="merge"):
        DDSketch(0.01).merge(DDSketch(0.02))
    with pytest.raises(ValueError):
        s.quantile(1.5)


def test_sketch_memory_is_the_value_range_not_the_count():
    rng = np.random.default_rng(0)
    s = DDSketch(ALPHA)
    for _ in range(20):
        s.add(rng.lognormal(3.0, 1.0, 50_000))
    assert s.count == 1_000_000
    # ~e^(+-5.5 sigma) around e^3: under 2,000 buckets, however many values
    assert s.buckets() < 2_000


@given(values, st.lists(st.integers(min_value=0, max_value=300), max_size=6))
def test_merge_equals_one_sketch_of_the_union(xs, cuts):
    x = np.array(xs)
    edges = sorted({0, x.size, *[c % (x.size + 1) for c in cuts]})
    one = DDSketch(ALPHA)
    one.add(x)
    merged = DDSketch(ALPHA)
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        part = DDSketch(ALPHA)
        part.add(x[a:b])
        merged.merge(part)
    assert merged.state() == one.state()
    qs = [0.0, 0.1, 0.5, 0.9, 0.99, 1.0]
    np.testing.assert_array_equal(merged.quantiles(qs), one.quantiles(qs))


# ---------------------------------------------------------------- exact sums


@given(
    st.lists(st.floats(min_value=-1e200, max_value=1e200, allow_nan=False), max_size=200),
    st.lists(st.integers(min_value=0, max_value=200), max_size=8),
)
def test_exact_sum_is_fsum_however_batched(xs, cuts):
    x = np.array(xs, dtype=np.float64)
    edges = sorted({0, x.size, *[c % (x.size + 1) for c in cuts]})
    s = ExactSum()
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        s.add(x[a:b])
    assert s.value == math.fsum(xs)
    s2 = ExactSum()
    s2.add(x[::-1].copy())
    assert s2.value == s.value


def test_exact_sum_keeps_what_one_rounding_would_lose():
    s = ExactSum()
    for v in (1e16, 1.0, 1.0, -1e16):  # a float64 running sum gives 0.0 (or 2.0 by luck)
        s.add(np.array([v]))
    assert s.value == 2.0


# ---------------------------------------------------------------- the streamed summary


def _frame_batch(frame: pd.DataFrame) -> Finished:
    """A Finished batch from a whole-run per-request table (finished requests only)."""
    return Finished(
        job=frame["id"].to_numpy(),
        trace_index=frame["trace_index"].to_numpy(),
        arrival_s=frame["arrival_s"].to_numpy(),
        admitted_s=frame["admitted_s"].to_numpy(),
        first_token_s=frame["first_token_s"].to_numpy(),
        finish_s=frame["finish_s"].to_numpy(),
        prompt_len=frame["prompt_len"].to_numpy(),
        output_len=frame["output_tokens"].to_numpy(),
        emitted=frame["output_tokens"].to_numpy(),
        steps=frame["decode_steps"].to_numpy(),
        verified=frame["verified_drafts"].to_numpy(),
        accepted=frame["accepted_drafts"].to_numpy(),
    )


@pytest.fixture(scope="module")
def chat_run():
    kw = dict(concurrency=16, requests=300, sla_tps=60.0, slo="ttft=40,tpot=8,e2e=3000")
    return kw, replay("chat", "hw-aware", record_tokens=False, **kw)


def test_summary_is_order_and_batch_independent(chat_run):
    """Shuffled and cut anywhere: the same means, shares and C-th completion, to the bit."""
    kw, res = chat_run
    frame = res.requests
    rng = np.random.default_rng(3)
    slo = {"ttft": 40.0, "tpot": 8.0, "e2e": 3000.0}
    for exact_rows in (10**6, 0):
        acc = StreamingSummary(60.0, slo, 16, StreamConfig(exact_rows=exact_rows))
        order = rng.permutation(len(frame))
        cuts = np.sort(rng.choice(len(frame), 7, replace=False))
        for part in np.split(order, cuts):
            acc.add(_frame_batch(frame.iloc[part]))
        s = res.summary
        assert acc.n_done == s["requests_completed"]
        assert acc.mean("ttft") == s["ttft_ms_mean"] and acc.mean("tpot") == s["tpot_ms_mean"]
        assert acc.mean("e2e") == s["e2e_ms_mean"] and acc.mean("tps") == s["per_user_tps_mean"]
        assert acc.sla_attainment == s["sla_attainment"]
        assert acc.slo_ok / acc.n_done == s["slo_attainment"]
        assert acc.input_tokens == s["input_tokens"] and acc.output_tokens == s["output_tokens"]
        assert acc.kth_finish(16) == np.sort(frame["finish_s"].to_numpy())[15]
        assert acc.exact == (exact_rows > 0)


def test_merged_streaming_summaries_equal_one(chat_run):
    _, res = chat_run
    frame = res.requests
    whole = StreamingSummary(60.0, None, 16)
    whole.add(_frame_batch(frame))
    a, b = StreamingSummary(60.0, None, 16), StreamingSummary(60.0, None, 16)
    a.add(_frame_batch(frame.iloc[::2]))
    b.add(_frame_batch(frame.iloc[1::2]))
    a.merge(b)
    for m in ("ttft", "tpot", "e2e", "tps"):
        assert a.mean(m) == whole.mean(m)
        assert a.sketches[m].state() == whole.sketches[m].state()
        for q in (50, 99):
            assert a.pct(m, q) == whole.pct(m, q)
    assert (a.n_done, a.sla_attainment, a.kth_finish(16)) == (
        whole.n_done, whole.sla_attainment, whole.kth_finish(16)
    )  # fmt: skip


def _runs(path: Path) -> list[dict]:
    base = dict(record_steps=False, record_tokens=False, sla_tps=50.0)
    return [
        dict(base, concurrency=16, requests=120, slo="ttft=200,tpot=20,e2e=4000"),
        dict(base, rate=40.0, requests=100, slo="tpot=15"),
    ]


@pytest.mark.slow
@pytest.mark.parametrize("path", TRACES, ids=[p.stem for p in TRACES])
def test_streamed_summary_on_every_shipped_trace(path):
    """Counts and means bit-identical; percentiles identical while the rows are kept, and
    within the sketch's alpha of numpy's when the sketch is forced."""
    assert TRACES, "no shipped traces found"
    for kw in _runs(path):
        whole = replay(path, "hw-aware", **kw).summary
        kept = replay(path, "hw-aware", stream=True, **kw)
        sketched = replay(path, "hw-aware", stream=True, stream_exact_rows=0, **kw)
        assert kept.requests is None and kept.config["stream"]["percentiles"] == "exact"
        assert sketched.config["stream"]["percentiles"] == f"ddsketch(alpha={ALPHA})"
        assert list(kept.summary) == list(whole)
        for key, exact in whole.items():
            if key in WALL_KEYS:
                continue
            assert _bits_equal(kept.summary[key], exact), key
            got = sketched.summary[key]
            if key in PCT_KEYS:
                assert abs(got - exact) <= ALPHA * abs(exact) * (1 + SLACK), key
            else:
                assert _bits_equal(got, exact), key


def test_streamed_summary_under_preemption_and_a_reserved_cache():
    """Preemption stalls (itl_ms_max), the steady window, and a reserved KV cache (the path
    serving model v1's test here took, retired with it)."""
    for kw in (
        dict(concurrency=32, requests=200, kv_tokens=6000, kv_block=16),
        dict(concurrency=8, requests=60, kv="reserve"),
    ):
        whole = replay("code", "zos", record_tokens=False, **kw)
        for rows in (100_000, 0):
            got = replay("code", "zos", record_tokens=False, stream=True, stream_exact_rows=rows,
                         **kw)  # fmt: skip
            for key, exact in whole.summary.items():
                if key in WALL_KEYS or (rows == 0 and key in PCT_KEYS):
                    continue
                assert _bits_equal(got.summary[key], exact), (kw, key)
    assert whole.summary["preemptions"] >= 0


def test_streamed_parquet_is_the_whole_run_table(tmp_path):
    import pyarrow.parquet as pq

    kw = dict(concurrency=8, requests=90, record_tokens=False)
    whole = replay("math", "hw-aware", **kw)
    out = tmp_path / "rows.parquet"
    res = replay("math", "hw-aware", stream=True, requests_out=str(out), **kw)
    assert res.requests is None and res.config["stream"]["requests_out"] == str(out)
    back = pd.read_parquet(out).sort_values("id").reset_index(drop=True)
    pd.testing.assert_frame_equal(back, whole.requests, check_dtype=False)
    assert not [p for p in tmp_path.iterdir() if p.name != "rows.parquet"]  # no temp left
    # row groups: a writer of 7 rows a group writes the table in ceil(n / 7) of them
    frame = whole.requests
    small = tmp_path / "small.parquet"
    w = ParquetRows(small, np.asarray(frame["trace_request"]), None, row_group=7)
    for a in range(0, len(frame), 10):
        w.add(_frame_batch(frame.iloc[a : a + 10]))
    w.close()
    assert pq.ParquetFile(small).metadata.num_row_groups >= len(frame) // 7
    assert len(pd.read_parquet(small)) == len(frame)


def test_a_refused_run_leaves_no_table(tmp_path):
    out = tmp_path / "none.parquet"
    with pytest.raises(SpecsimError, match="no request completed"):
        replay("chat", rate=0.001, duration=1.0, stream=True, requests_out=str(out))
    assert not list(tmp_path.iterdir())  # neither the table nor its temporary name


def test_stream_options_are_checked():
    with pytest.raises(SpecsimError, match="stream=True"):
        replay("chat", requests_out="x.parquet")
    with pytest.raises(SpecsimError, match="parquet"):
        replay("chat", stream=True, requests_out="x.csv")
    with pytest.raises(SpecsimError, match="stream_exact_rows"):
        replay("chat", stream=True, stream_exact_rows=-1)


def test_replay_command_streams_out(tmp_path, capsys):
    from specsim.cli import main

    out = tmp_path / "req.parquet"
    args = ["replay", "chat", "--policy", "hw-aware", "--concurrency", "4", "--requests", "20"]
    assert main([*args, "--json", "--stream", "--out", str(out)]) == 0
    streamed = json.loads(capsys.readouterr().out)
    assert main([*args, "--json"]) == 0
    whole = json.loads(capsys.readouterr().out)
    assert len(pd.read_parquet(out)) == 20
    for key in whole:
        if key not in WALL_KEYS and key != "config":
            assert streamed[key] == whole[key], key
    assert main([*args, "--stream", "--out", str(tmp_path / "req.csv")]) != 0
    assert "give a .parquet file" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("flush", [1, 3, 64])
def test_recycled_slots_change_nothing(monkeypatch, tmp_path, flush):
    """Flushes mid-run release finished jobs' slots for reuse (a streamed closed loop): every
    number and every row as the whole run's, while the job arrays stay the size in flight."""
    import functools

    import specsim.sim.serving as engine_mod
    import specsim.sim.streaming as streaming_mod
    from specsim.sim.jobs import Jobs

    made: list[Jobs] = []

    class Recorded(Jobs):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made.append(self)

    monkeypatch.setattr(engine_mod, "_Jobs", Recorded)
    cfg = functools.partial(streaming_mod.StreamConfig, flush_rows=flush)
    monkeypatch.setattr(streaming_mod, "StreamConfig", cfg)
    for kw in (
        dict(concurrency=8, requests=150, kv="reserve"),
        dict(concurrency=24, requests=200, kv_tokens=6000, kv_block=16),  # preemptions
    ):
        whole = replay("chat", "hw-aware", record_tokens=False, slo="ttft=50", **kw)
        out = tmp_path / f"r{flush}-{kw['concurrency']}.parquet"
        got = replay("chat", "hw-aware", record_tokens=False, slo="ttft=50", stream=True,
                     requests_out=str(out), **kw)  # fmt: skip
        jobs = made[-1]
        assert jobs.recycle and jobs.issued == kw["requests"]
        assert jobs.n <= 4 * kw["concurrency"] + flush  # slots in use at most, not 1 a request
        for key, exact in whole.summary.items():
            if key not in WALL_KEYS:
                assert _bits_equal(got.summary[key], exact), (kw, key)
        back = pd.read_parquet(out).sort_values("id").reset_index(drop=True)
        pd.testing.assert_frame_equal(back, whole.requests, check_dtype=False)


def test_one_token_outputs_are_skipped_as_the_exact_summary_skips_them():
    """NaN TPOT (no decode phase): left out of means and percentiles, meets the SLA and SLO."""
    from specsim.sim.toy import iid_trace

    out = np.array([1, 1, 40, 1, 7, 90, 1, 3] * 6)
    tr = iid_trace(len(out), out, prompt_len=64, seed=4)
    kw = dict(concurrency=4, requests=48, sla_tps=500.0, slo="tpot=1,ttft=30", record_tokens=False)
    whole = replay(tr, "hw-aware", **kw)
    assert np.isnan(whole.requests["tpot_ms"]).sum() == 24
    for rows in (100_000, 0):
        got = replay(tr, "hw-aware", stream=True, stream_exact_rows=rows, **kw)
        for key, exact in whole.summary.items():
            if key in WALL_KEYS:
                continue
            if rows == 0 and key in PCT_KEYS:
                assert abs(got.summary[key] - exact) <= ALPHA * abs(exact) * (1 + SLACK), key
            else:
                assert _bits_equal(got.summary[key], exact), key
