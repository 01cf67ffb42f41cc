"""Workloads: arrival processes, the trace-request mapping, Azure CSV replay, bounds."""

from __future__ import annotations

import numpy as np
import pytest

from specsim.errors import SpecsimError
from specsim.sim.simulate import replay
from specsim.sim.toy import iid_trace
from specsim.sim.workload import length_matched, make_workload, open_loop_times, read_arrivals

Z = 5.0


def test_poisson_gaps_have_the_rate():
    n, rate = 20_000, 7.0
    gaps = np.diff(np.concatenate(([0.0], open_loop_times(rate, None, seed=1, n=n, duration=None))))
    # exponential: mean 1/rate, SD 1/rate, so SE of the mean gap = 1/(rate sqrt(n))
    assert abs(gaps.mean() - 1 / rate) < Z / (rate * np.sqrt(n))
    assert abs(gaps.mean() - 1 / (1.1 * rate)) > Z / (rate * np.sqrt(n))  # a 10% rate error fails


@pytest.mark.parametrize("cv", [0.5, 3.0])
def test_gamma_gaps_have_the_cv(cv):
    n, rate = 50_000, 2.0
    gaps = np.diff(np.concatenate(([0.0], open_loop_times(rate, cv, seed=2, n=n, duration=None))))
    assert abs(gaps.mean() * rate - 1) < Z * cv / np.sqrt(n)
    sample_cv = gaps.std() / gaps.mean()
    # SE of a sample CV of a Gamma: ~ cv * sqrt((1 + 2 cv^2) / (2 n)) (delta method, generous)
    se = cv * np.sqrt((1 + 2 * cv * cv) / (2 * n)) * 2
    assert abs(sample_cv - cv) < Z * se
    assert abs(sample_cv - 1.0) > Z * se  # it is not Poisson


def test_duration_bounds_arrivals():
    t = open_loop_times(5.0, None, seed=0, n=None, duration=100.0)
    assert t.max() <= 100.0 and t.shape[0] > 400
    tr = iid_trace(10, 20)
    res = replay(tr, "ar", rate=5.0, duration=10.0, seed=0)
    assert res.requests["arrival_s"].max() <= 10.0
    assert res.summary["requests_completed"] == len(res.requests)


def test_permutation_is_cycled():
    tr = iid_trace(7, 10)
    wl = make_workload(tr, rate=1.0, requests=21, seed=4)
    idx = wl.trace_idx
    assert sorted(idx[:7]) == list(range(7))
    np.testing.assert_array_equal(idx[:7], idx[7:14])
    closed = make_workload(tr, concurrency=3, requests=14, seed=4)
    assert [closed.job(i)[0] for i in range(14)] == list(idx[:14])


def test_closed_loop_keeps_concurrency():
    tr = iid_trace(50, 40, alpha=0.7)
    res = replay(tr, "hw-aware", concurrency=6, requests=50, seed=1)
    st = res.steps
    busy = st[st["time_s"] < res.requests["arrival_s"].max()]
    assert (busy["running"] + busy["queued"] == 6).all()
    # a new request arrives exactly when one finishes
    arrivals = np.sort(res.requests["arrival_s"].to_numpy())[6:]
    finishes = np.sort(res.requests["finish_s"].to_numpy())[: len(arrivals)]
    np.testing.assert_allclose(arrivals, finishes)


def test_default_load_is_concurrency_one():
    tr = iid_trace(5, 10)
    res = replay(tr, "ar")
    assert res.config["workload"] == "closed" and (res.steps["running"] == 1).all()


def test_length_matched_sampling():
    trace_out = np.array([5, 10, 10, 50, 80, 80])
    want = np.array([1, 10, 11, 60, 100, 81] * 200)
    idx = length_matched(trace_out, want, seed=3)
    got = trace_out[idx]
    long_enough = want <= trace_out.max()
    assert (got[long_enough] >= want[long_enough]).all()
    assert (got[~long_enough] == trace_out.max()).all()  # none long enough: one of the longest
    # uniform among the eligible: want=11 picks 50, 80, 80 -> index 3 a third of the time
    sel = idx[want == 11]
    share = (sel == 3).mean()
    assert abs(share - 1 / 3) < Z * np.sqrt(2 / 9 / sel.size)
    assert set(idx[want == 1]) == set(range(6))


def test_azure_builtin_replay():
    name, t, prompt, dec = read_arrivals("azure-conv")
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0) and t.shape[0] > 19_000
    tr = iid_trace(100, 200, alpha=0.8, seed=1)
    res = replay(tr, "hw-aware", arrivals="azure-code", requests=300, seed=2)
    req = res.requests
    _, t2, p2, d2 = read_arrivals("azure-code")
    np.testing.assert_allclose(req["arrival_s"], t2[:300])
    np.testing.assert_array_equal(req["prompt_len"], p2[:300])
    np.testing.assert_array_equal(req["output_tokens"], np.minimum(d2[:300], 200))


@pytest.mark.parametrize(
    "kw, msg",
    [
        (dict(rate=1.0, concurrency=2), "exactly one load"),
        (dict(rate=-1.0), "--rate"),
        (dict(concurrency=0), "--concurrency"),
        (dict(concurrency=2, cv=2.0), "--cv"),
        (dict(rate=1.0, requests=0), "--requests"),
        (dict(rate=1.0, requests=3, duration=2.0), "not both"),
        (dict(arrivals="/no/such.csv"), "does not exist"),
    ],
)
def test_bad_loads_are_one_line_errors(kw, msg):
    tr = iid_trace(3, 5)
    with pytest.raises(SpecsimError, match=msg) as exc:
        make_workload(tr, **kw)
    assert "\n" not in str(exc.value)


def test_bad_arrivals_csv(tmp_path):
    p = tmp_path / "a.csv"
    p.write_text("time,prompt\n1,2\n")
    with pytest.raises(SpecsimError, match="lacks column"):
        read_arrivals(str(p))


def test_kv_too_small_for_one_request():
    tr = iid_trace(3, 100, prompt_len=50)
    with pytest.raises(SpecsimError, match="give a larger --kv-tokens"):
        replay(tr, "ar", concurrency=1, kv_tokens=100)
